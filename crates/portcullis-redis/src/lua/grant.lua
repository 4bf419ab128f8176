-- The grant of a rate share to a local budget (budget/grant.rs):
-- gcra_take, and what it reads: the policy argument (gcra_policy), a
-- GCRA state this policy wrote (own_state) and the state's lead over now
-- (batch_lead). The library holds it after plan.lua and before
-- library.lua (whose fast functions, and the coalesced batches, read
-- own_state and batch_lead too) and registers gcra_take in batch.lua,
-- with the policy arguments it parsed remembered (memo); the `EVALSHA`
-- path runs it as a script of its own, after prelude.lua alone
-- (scripts/mod.rs, compose_grant), parsing the argument per call. Both
-- answer the same for the same state.

-- A one-policy GCRA argument "<limit>:<period_us>:<capacity>" of a whole
-- emission interval whose capacity x interval is exact in Lua, as
-- { interval, capacity x interval, that + the clock tolerance, capacity,
-- the state's shape tail }; nil for any other argument.
local function gcra_policy(arg)
  local a, b, c = string.match(arg, '^(%d+):(%d+):(%d+)$')
  if a == nil then
    return nil
  end
  local L, P, B = tonumber(a), tonumber(b), tonumber(c)
  if L < 1 or P % L ~= 0 then
    return nil
  end
  local ei = P / L
  local cap = B * ei
  if cap > MAX then
    return nil
  end
  return { ei, cap, cap + tolerance(cap), B, '@' .. arg }
end

-- The value of a GCRA state this policy wrote (one ending in its shape
-- tail, prelude.lua), or of an earlier version's state without a tail,
-- without the tail; nil for a state written in another policy's units
-- (which only the general check reads, rescaling it) or of another type.
local function own_state(value, tail)
  if type(value) ~= 'string' then
    return nil
  end
  local n = #value - #tail
  if n > 0 and string.find(value, tail, n + 1, true) == n + 1 then
    return string.sub(value, 1, n)
  end
  if string.find(value, '@', 1, true) then
    return nil
  end
  return value
end

-- The state's lead over now, for gcra_batch and gcra_take (f as
-- gcra_policy answers it): a number, or a status reply (GENERAL for a
-- state only the general check reads, NOROOM for a new key under the
-- allow-oom twin), having written nothing.
local function batch_lead(key, now, f, no_new_keys)
  local value = redis.pcall('GET', key)
  if value then
    value = own_state(value, f[5])
    local tat = value ~= nil and tonumber(value, 16)
    if not tat or tat >= 2 * MAX or tat - now > f[3] then
      return redis.status_reply('GENERAL')
    end
    if tat > now then
      return tat - now
    end
    return 0
  elseif no_new_keys then
    return redis.status_reply('NOROOM')
  end
  return 0
end

-- gcra_take(keys, args, no_new_keys, parse): a rate share for a local
-- budget (budget/): the next emission slots of the state, in order, those
-- whose GCRA time (when the exact check would admit them) lies within the
-- horizon after now, at most ARGV[4] of them, all charged at once. Slot j
-- (from 1) has the GCRA time now + max(0, ahead + j x interval - capacity
-- x interval): the first slots may be due at once (the burst left), the
-- later ones one interval apart. ARGV[1] =
-- "<limit>:<period_us>:<capacity>" (read by parse: gcra_policy, or the
-- library's remembering form of it), ARGV[2] = now or '', ARGV[3] = the
-- asking check's cost (at least that many slots, else none), ARGV[4] = the
-- most slots, ARGV[5] = the horizon in us (the grant period), cut to the
-- clock tolerance beyond the capacity, so that every reader still reads
-- the state (as denying until it comes down). Reply: { n, ahead } with n
-- the slots charged and ahead the state's lead over now before the call;
-- n = 0 (and nothing written) when fewer than ARGV[3] fit. The asking
-- check is admitted when its slots are due at once (ahead + cost x
-- interval <= capacity x interval), which the client derives. Or the
-- status GENERAL, having written nothing, for a state only the general
-- check reads; or NOROOM from the allow-oom twin for a new key.
local function gcra_take(keys, args, no_new_keys, parse)
  local f = parse(args[1])
  local least, most, horizon = tonumber(args[3]), tonumber(args[4]), tonumber(args[5])
  if f == nil or least == nil or most == nil or horizon == nil or least < 1 or least > most
      or least > f[4] or horizon < 0 then
    return redis.error_reply('ERR portcullis: a rate share needs <limit>:<period_us>:<capacity>, now, least, most, horizon; upgrade portcullis-redis')
  end
  local now = now_of(args[2])
  local ahead = batch_lead(keys[1], now, f, no_new_keys)
  if type(ahead) ~= 'number' then
    return ahead
  end
  if horizon > f[3] - f[2] then
    horizon = f[3] - f[2]
  end
  -- The slots whose GCRA time is within the horizon:
  -- ahead + n x interval <= capacity x interval + horizon.
  local fit = math.floor((f[2] + horizon - ahead) / f[1])
  if fit < least then
    return { 0, ahead }
  end
  local n = most
  if fit < n then
    n = fit
  end
  local span = ahead + n * f[1]
  put(keys[1], string.format('%x', now + span) .. f[5], now + span)
  return { n, ahead }
end
