-- GCRA and the time-pair arithmetic shared with the leaky bucket queue.
-- State: the string "<tag>:<us>:<rem>", the time us + rem/L microseconds.

-- Parses "<tag>:<us>:<rem>"; a rem >= L (left by a policy whose limit
-- changed) is carried into us.
local function pair_parse(value, tag, L)
  if value == nil then
    return nil, nil
  end
  local us, rem = string.match(value, '^' .. tag .. ':(%d+):(%d+)$')
  if us == nil then
    return nil, nil
  end
  us, rem = tonumber(us), tonumber(rem)
  if rem >= L then
    us = us + div(rem, L)
    rem = rem % L
  end
  return us, rem
end

-- One GCRA step. Returns allowed, remaining, retry_after, reset_after,
-- delay, new_us, new_rem (new_* nil when nothing is to be written).
local function pair_step(us, rem, L, P, B, now, c)
  local peek = c == 0
  local cost = c
  if peek then
    cost = 1
  end
  local base_us, base_rem = now, 0
  if us ~= nil and us >= now then
    base_us, base_rem = us, rem
  end
  local inc = cost * P
  local q = div(inc, L)
  local new_us, new_rem = base_us + q, base_rem + (inc - q * L)
  if new_rem >= L then
    new_us, new_rem = new_us + 1, new_rem - L
  end
  local cap = B * P
  local span_new = (new_us - now) * L + new_rem
  local span_old = (base_us - now) * L + base_rem
  if span_new <= cap then
    local delay = ceil_div(span_old, L)
    if peek then
      return true, div(max0(cap - span_old), P), -1, ceil_div(span_old, L), delay, nil, nil
    end
    return true, div(cap - span_new, P), -1, ceil_div(span_new, L), delay, new_us, new_rem
  end
  return false, div(max0(cap - span_old), P), ceil_div(span_new - cap, L), ceil_div(span_old, L), 0, nil, nil
end

ALG.gcra = function(key, L, P, B, now, c)
  local us, rem = pair_parse(read_string(key), 'gcra', L)
  local ok, remaining, retry, reset, _, new_us, new_rem = pair_step(us, rem, L, P, B, now, c)
  if new_us == nil then
    return { ok, remaining, retry, reset, 0 }
  end
  return { ok, remaining, retry, reset, 0, key, 'gcra:' .. fmt(new_us) .. ':' .. fmt(new_rem), now + reset }
end
