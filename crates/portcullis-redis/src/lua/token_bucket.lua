-- Token bucket. level = tokens x I; refill S units per microsecond
-- (S, I = bucket_scale(L, P, B): S = L and I = P when exact).
-- State: the string "token_bucket:<level>:<last_us>".
-- The stored level and last of key, or nil when it holds no readable
-- token-bucket state (also read by charge.lua).
local function token_bucket_read(key)
  local value = read_string(key)
  if value == nil then
    return nil
  end
  local a, b = string.match(value, '^token_bucket:(%d+):(%d+)$')
  if a == nil then
    return nil
  end
  local l, t = num(a), num(b)
  if l == nil or t == nil then
    return nil
  end
  return l, t
end

ALG.token_bucket = function(key, L, P, B, now, c)
  local S, I = bucket_scale(L, P, B)
  local full = B * I
  local level, last = full, now
  local l, t = token_bucket_read(key)
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
      put(key, 'token_bucket:0:' .. fmt(now), now + ceil_div(full, S))
    end
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
      'token_bucket:' .. fmt(new_level) .. ':' .. fmt(new_last), now + reset }
  end
  return { false, div(level, I), lag + ceil_div(need - level, S), lag + ceil_div(full - level, S), 0 }
end
