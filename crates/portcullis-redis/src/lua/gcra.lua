-- GCRA and the time-pair arithmetic shared with the leaky bucket queue.
-- State: the time us + rem/S microseconds (S, I = bucket_scale(L, P, B):
-- S = L and I = P when exact). GCRA stores it as us in hexadecimal when
-- rem is 0 (the common case: what Lua reads cheapest), else as the string
-- "gcra:<us>:<rem>" (decimal); the leaky bucket queue always as
-- "leaky_queue:<us>:<rem>". Both forms are read (a Redis written by an
-- earlier version holds "gcra:<us>:0").

-- Parses a state; a rem >= S (left by a policy with another scale) is
-- carried into us. Anything else is no state.
local function pair_parse(value, tag, S)
  if value == nil then
    return nil, nil
  end
  if tag == 'gcra' then
    -- Hexadecimal: tonumber(v, 16) is strtoul, while a 16-digit decimal
    -- takes strtod's slow path (about 4,000 server instructions).
    local us = tonumber(value, 16)
    if us ~= nil then
      -- 2^53 on (a negative wraps there too) is no state.
      if us < 2 * MAX then
        return us, 0
      end
      return nil, nil
    end
  end
  local a, b = string.match(value, '^' .. tag .. ':(%d+):(%d+)$')
  if a == nil then
    return nil, nil
  end
  local us, rem = num(a), num(b)
  if us == nil or rem == nil then
    return nil, nil
  end
  if rem >= S then
    us = us + div(rem, S)
    rem = rem % S
  end
  return us, rem
end

-- One GCRA step in units of 1/S microsecond, a permit being I units.
-- Returns allowed, remaining, retry_after, reset_after, delay, new_us,
-- new_rem (new_* nil when nothing is to be written), and repair_us,
-- repair_rem when the stored time lay further ahead than the policy can
-- leave, beyond the clock tolerance (clamped to now + B x I / S; the
-- caller writes it on a charge).
--
-- Everything is computed relative to now (span = (time - now) x S): spans
-- stay within 2 x B x I <= 2^53 while the time is at most the worst case
-- ahead, while an absolute time in units could pass 2^53. Within the clock
-- tolerance beyond it, only whole microseconds ahead (`ahead`) and the
-- fraction are used. The absolute time is formed only for a state to
-- write, which lies at most B x I / S after now.
local function pair_step(us, rem, S, I, B, now, c)
  local peek = c == 0
  local cost = c
  if peek then
    cost = 1
  end
  local cap = B * I
  local ahead, span_old = 0, 0
  if us ~= nil and us >= now then
    ahead = us - now
    span_old = ahead * S + rem -- compared with cap only, unless <= cap
  else
    rem = 0
  end
  local full_reset = ceil_div(cap, S)
  local repair_us, repair_rem = nil, nil
  if ahead > full_reset + tolerance(full_reset) then
    local whole = div(cap, S)
    ahead, rem, span_old = whole, cap - whole * S, cap
    repair_us, repair_rem = now + whole, rem
  end
  local charge = cost * I
  if span_old > cap then
    -- Within the tolerance: denied, every figure from ahead and rem.
    local d = cap - charge
    local retry
    if rem >= d then
      retry = ahead
      if rem > d then
        retry = ahead + 1
      end
    else
      retry = ahead - div(d - rem, S)
    end
    local reset = ahead
    if rem > 0 then
      reset = ahead + 1
    end
    return false, 0, retry, reset, 0, nil, nil, repair_us, repair_rem
  end
  local span_new = span_old + charge
  if span_new <= cap then
    local delay = ceil_div(span_old, S)
    if peek then
      return true, div(cap - span_old, I), -1, delay, delay, nil, nil, repair_us, repair_rem
    end
    local whole = div(span_new, S)
    return true, div(cap - span_new, I), -1, ceil_div(span_new, S), delay, now + whole, span_new - whole * S, repair_us, repair_rem
  end
  return false, div(cap - span_old, I), ceil_div(span_old - (cap - charge), S), ceil_div(span_old, S), 0, nil, nil, repair_us, repair_rem
end

-- The value stored for the time us + rem/S: GCRA's hexadecimal integer
-- when rem is 0, else a tagged string; callers append the shape tail.
local function pair_value(tag, us, rem)
  if rem == 0 and tag == 'gcra' then
    return string.format('%x', us)
  end
  return tag .. ':' .. fmt(us) .. ':' .. fmt(rem)
end

-- The time a GCRA-family state of key holds, in the units of the policy
-- (L, P, B) with time unit S and permit I, whose states end in tail:
-- us, rem, rescaled. A state written by a policy of other units
-- (unshape) is carried over (algorithms::rescale): the time it lies ahead
-- of now is owed permits, converted at most to the new capacity; a time in
-- the past is no state; one beyond its own policy's worst case and clock
-- tolerance is left as it is (for pair_step to clamp).
local function pair_read(key, tag, B, S, I, now, tail)
  local value = read_string(key)
  if value == nil then
    return nil, nil, false
  end
  local body, L0, P0, B0 = unshape(value, tail)
  if body == nil then
    return nil, nil, false
  end
  if L0 == nil then
    local us, rem = pair_parse(body, tag, S)
    return us, rem, false
  end
  local S0, I0 = bucket_scale(L0, P0, B0)
  local us, rem = pair_parse(body, tag, S0)
  if us == nil then
    return nil, nil, false
  end
  if us < now then
    -- In the past in its own units: no debt. (Read in the current units, a
    -- remainder of the writer's scale could be carried into whole
    -- microseconds ahead: a key Redis keeps until its PXAT, up to a
    -- millisecond after the state expired, would then hold a subject back.)
    return nil, nil, false
  end
  local full_reset = ceil_div(B0 * I0, S0)
  if (S0 == S and I0 == I and B0 == B) or us - now > full_reset + tolerance(full_reset) then
    -- Read as it is, in the current units (as the Rust reads a state it
    -- does not rescale): a remainder past S carried.
    if rem >= S then
      us = us + div(rem, S)
      rem = rem % S
    end
    return us, rem, false
  end
  local ahead = us - now
  local span = convert(ahead * S0 + rem, I0, I, B * I)
  local whole = div(span, S)
  return now + whole, span - whole * S, true
end

-- The GCRA-family step on key: reads (rescaling), steps, writes a repair
-- or a rescaled state on a charge, and builds the decision table.
local function pair_alg(tag, key, L, P, B, now, c, queue, tail)
  tail = tail or tail_of(L, P, B)
  local S, I = bucket_scale(L, P, B)
  local us, rem, rescaled = pair_read(key, tag, B, S, I, now, tail)
  local ok, remaining, retry, reset, delay, new_us, new_rem, repair_us, repair_rem = pair_step(us, rem, S, I, B, now, c)
  if not queue then
    delay = 0
  end
  if repair_us ~= nil and c > 0 then
    -- A charge writes the clamped time whatever the verdict; an admission
    -- overwrites it below.
    put(key, pair_value(tag, repair_us, repair_rem) .. tail, now + ceil_div(B * I, S))
  elseif rescaled and c > 0 then
    -- As a repair: the state in the new units, whatever the verdict,
    -- expiring when its own time is reached.
    local expires = us
    if rem > 0 then
      expires = us + 1
    end
    put(key, pair_value(tag, us, rem) .. tail, expires)
  end
  if new_us == nil then
    return { ok, remaining, retry, reset, delay }
  end
  return { ok, remaining, retry, reset, delay, key, pair_value(tag, new_us, new_rem) .. tail, now + reset }
end

ALG.gcra = function(key, L, P, B, now, c, tail)
  return pair_alg('gcra', key, L, P, B, now, c, false, tail)
end
