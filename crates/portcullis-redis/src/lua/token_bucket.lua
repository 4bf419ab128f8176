-- Token bucket. level = tokens x I; refill S units per microsecond
-- (S, I = bucket_scale(L, P, B): S = L and I = P when exact).
-- State: the string "token_bucket:<level>:<last_us>" and its shape tail
-- (prelude.lua, unshape).
-- The stored level and last of key in the units (S, I, B) of the policy
-- whose states end in tail, and whether they were rescaled from another
-- policy's (refilled at its rate until now, then the tokens taken carried
-- over: algorithms::rescale); nil when it holds no readable token-bucket
-- state (also read by charge.lua).
local function token_bucket_read(key, tail, S, I, B, now)
  local value = read_string(key)
  if value == nil then
    return nil
  end
  local body, L0, P0, B0 = unshape(value, tail)
  if body == nil then
    return nil
  end
  local a, b = string.match(body, '^token_bucket:(%d+):(%d+)$')
  if a == nil then
    return nil
  end
  local l, t = num(a), num(b)
  if l == nil or t == nil then
    return nil
  end
  if L0 == nil then
    return l, t, false
  end
  local S0, I0 = bucket_scale(L0, P0, B0)
  if S0 == S and I0 == I and B0 == B then
    return l, t, false
  end
  local full0 = B0 * I0
  if l > full0 then
    l = full0
  end
  if now > t then
    if now - t >= ceil_div(full0 - l, S0) then
      l = full0
    else
      l = l + (now - t) * S0
    end
    t = now
  end
  local full = B * I
  return full - convert(full0 - l, I0, I, full), t, true
end

ALG.token_bucket = function(key, L, P, B, now, c, tail)
  tail = tail or tail_of(L, P, B)
  local S, I = bucket_scale(L, P, B)
  local full = B * I
  local level, last = full, now
  local l, t, rescaled = token_bucket_read(key, tail, S, I, B, now)
  if l ~= nil then
    level, last = l, t
  end
  if level > full then
    level = full
  end
  if now > last then
    if now - last >= ceil_div(full - level, S) then
      level = full
    else
      level = level + (now - last) * S
    end
  end
  local new_last = last
  if now > new_last then
    new_last = now
  end
  local lag = new_last - now
  local full_reset = ceil_div(full, S)
  if lag + ceil_div(full - level, S) > full_reset + tolerance(full_reset) then
    -- Back to full later than an empty bucket now would be, beyond the
    -- clock tolerance: clamped to an empty bucket now, written back on a
    -- charge.
    level, new_last, lag = 0, now, 0
    if c > 0 then
      put(key, 'token_bucket:0:' .. fmt(now) .. tail, now + ceil_div(full, S))
    end
  elseif rescaled and c > 0 then
    -- As a repair: the state in the new units, whatever the verdict.
    put(key, 'token_bucket:' .. fmt(level) .. ':' .. fmt(new_last) .. tail,
      now + lag + ceil_div(full - level, S))
  end
  local cost = c
  if c == 0 then
    cost = 1
  end
  local need = cost * I
  if level >= need then
    if c == 0 then
      return { true, div(level, I), -1, lag + ceil_div(full - level, S), 0 }
    end
    local new_level = level - need
    local reset = lag + ceil_div(full - new_level, S)
    return { true, div(new_level, I), -1, reset, 0, key,
      'token_bucket:' .. fmt(new_level) .. ':' .. fmt(new_last) .. tail, now + reset }
  end
  return { false, div(level, I), lag + ceil_div(need - level, S), lag + ceil_div(full - level, S), 0 }
end
