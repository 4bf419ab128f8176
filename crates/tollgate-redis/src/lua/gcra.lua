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
--
-- Everything is computed relative to now, in units of 1/L microsecond
-- (span = (time - now) x L): spans stay within 2 x B x P <= 2^53, while an
-- absolute time plus a span could pass 2^53 for bursts near the policy cap.
-- The absolute time is formed only for a state to write, which lies at most
-- B x P / L after now.
local function pair_step(us, rem, L, P, B, now, c)
  local peek = c == 0
  local cost = c
  if peek then
    cost = 1
  end
  -- span_old = (max(time, now) - now) x L
  local span_old = 0
  if us ~= nil and us >= now then
    span_old = (us - now) * L + rem
  end
  local cap = B * P
  local span_new = span_old + cost * P
  if span_new <= cap then
    local delay = ceil_div(span_old, L)
    if peek then
      return true, div(cap - span_old, P), -1, delay, delay, nil, nil
    end
    local whole = div(span_new, L)
    return true, div(cap - span_new, P), -1, ceil_div(span_new, L), delay, now + whole, span_new - whole * L
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
