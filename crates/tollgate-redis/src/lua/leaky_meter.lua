-- Leaky bucket as a meter. level = water x P; drains L units per microsecond.
-- State: the string "leaky_meter:<level>:<last_us>".
ALG.leaky_meter = function(key, L, P, B, now, c)
  local full = B * P
  local level, last = 0, now
  local value = read_string(key)
  if value ~= nil then
    local a, b = string.match(value, '^leaky_meter:(%d+):(%d+)$')
    if a ~= nil then
      level, last = tonumber(a), tonumber(b)
    end
  end
  if now > last then
    if now - last >= ceil_div(level, L) then
      level = 0
    else
      level = level - (now - last) * L
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
  if level + need <= full then
    if c == 0 then
      return { true, div(full - level, P), -1, lag + ceil_div(level, L), 0 }
    end
    local new_level = level + need
    local reset = lag + ceil_div(new_level, L)
    return { true, div(full - new_level, P), -1, reset, 0, key,
      'leaky_meter:' .. fmt(new_level) .. ':' .. fmt(new_last), now + reset }
  end
  return { false, div(max0(full - level), P), lag + ceil_div(level + need - full, L), lag + ceil_div(level, L), 0 }
end
