-- Leaky bucket as a meter. level = water x I; drains S units per microsecond
-- (S, I = bucket_scale(L, P, B): S = L and I = P when exact).
-- State: the string "leaky_meter:<level>:<last_us>" and its shape tail
-- (prelude.lua, unshape). Water written by a policy of other units is
-- drained at its rate until now, then carried over (algorithms::rescale).
ALG.leaky_meter = function(key, L, P, B, now, c, tail)
  tail = tail or tail_of(L, P, B)
  local S, I = bucket_scale(L, P, B)
  local full = B * I
  local level, last = 0, now
  local rescaled = false
  local value = read_string(key)
  if value ~= nil then
    local body, L0, P0, B0 = unshape(value, tail)
    local a, b
    if body ~= nil then
      a, b = string.match(body, '^leaky_meter:(%d+):(%d+)$')
    end
    if a ~= nil then
      local l, t = num(a), num(b)
      if l ~= nil and t ~= nil then
        level, last = l, t
        if L0 ~= nil then
          local S0, I0 = bucket_scale(L0, P0, B0)
          if S0 ~= S or I0 ~= I or B0 ~= B then
            if now > last then
              if now - last >= ceil_div(level, S0) then
                level = 0
              else
                level = level - (now - last) * S0
              end
              last = now
            end
            level = convert(level, I0, I, full)
            rescaled = true
          end
        end
      end
    end
  end
  if now > last then
    if now - last >= ceil_div(level, S) then
      level = 0
    else
      level = level - (now - last) * S
    end
  end
  local new_last = last
  if now > new_last then
    new_last = now
  end
  local lag = new_last - now
  local full_reset = ceil_div(full, S)
  if level > full or lag + ceil_div(level, S) > full_reset + tolerance(full_reset) then
    -- More water than the bucket holds, or empty later than a full bucket
    -- now would be beyond the clock tolerance: clamped to a full bucket
    -- now, written back on a charge.
    level, new_last, lag = full, now, 0
    if c > 0 then
      put(key, 'leaky_meter:' .. fmt(full) .. ':' .. fmt(now) .. tail, now + ceil_div(full, S))
    end
  elseif rescaled and c > 0 then
    -- As a repair: the state in the new units, whatever the verdict.
    put(key, 'leaky_meter:' .. fmt(level) .. ':' .. fmt(new_last) .. tail,
      now + lag + ceil_div(level, S))
  end
  local cost = c
  if c == 0 then
    cost = 1
  end
  local need = cost * I
  if level + need <= full then
    if c == 0 then
      return { true, div(full - level, I), -1, lag + ceil_div(level, S), 0 }
    end
    local new_level = level + need
    local reset = lag + ceil_div(new_level, S)
    return { true, div(full - new_level, I), -1, reset, 0, key,
      'leaky_meter:' .. fmt(new_level) .. ':' .. fmt(new_last) .. tail, now + reset }
  end
  return { false, div(max0(full - level), I), lag + ceil_div(level + need - full, S), lag + ceil_div(level, S), 0 }
end
