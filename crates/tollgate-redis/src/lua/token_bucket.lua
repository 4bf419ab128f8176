-- Token bucket. level = tokens x P; refill L units per microsecond.
-- State: the string "token_bucket:<level>:<last_us>".
ALG.token_bucket = function(key, L, P, B, now, c)
  local full = B * P
  local level, last = full, now
  local value = read_string(key)
  if value ~= nil then
    local a, b = string.match(value, '^token_bucket:(%d+):(%d+)$')
    if a ~= nil then
      level, last = tonumber(a), tonumber(b)
    end
  end
  if level > full then
    level = full
  end
  if now > last then
    if now - last >= ceil_div(full - level, L) then
      level = full
    else
      level = level + (now - last) * L
    end
  end
  local new_last = last
  if now > new_last then
    new_last = now
  end
  local lag = new_last - now
  local cost = c
  if c == 0 then
    cost = 1
  end
  local need = cost * P
  if level >= need then
    if c == 0 then
      return { true, div(level, P), -1, lag + ceil_div(full - level, L), 0 }
    end
    local new_level = level - need
    local reset = lag + ceil_div(full - new_level, L)
    return { true, div(new_level, P), -1, reset, 0, key,
      'token_bucket:' .. fmt(new_level) .. ':' .. fmt(new_last), now + reset }
  end
  return { false, div(level, P), lag + ceil_div(need - level, L), lag + ceil_div(full - level, L), 0 }
end
