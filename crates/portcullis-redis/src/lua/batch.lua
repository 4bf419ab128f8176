-- Coalesced checks (coalesce.rs): the checks of one subject and policies
-- that waited on one client while a call for them was in flight, sent as
-- one call that decides them one after another, in the order given, as if
-- each had been called alone at the same instant. One reply per check.
-- (Library only: after plan.lua, which defines plan(), library.lua,
-- which defines GCRA_PLAN, and batch_script.lua.)
--
-- batch(keys, args): the general form, every algorithm and several
-- policies. ARGV[1] = the plan, then batch_script.lua's arguments: ARGV[2]
-- = now or '' (TIME, read once), ARGV[3] = n, the number of checks,
-- ARGV[3+j] = the cost of check j, ARGV[4+n..] = the policies, as
-- check.lua takes them. Reply: n replies, each what check.lua answers
-- alone (five integers per policy, or the status NOROOM from the
-- allow-oom twin). The loop is batch_script's, which the `EVALSHA` path
-- runs as a script composed for the policy set.
local function batch(keys, args, no_new_keys)
  local p = plan(args[1])
  if p == nil then
    return redis.error_reply('ERR portcullis: unknown plan; upgrade portcullis-redis')
  end
  return batch_script(p, keys, { unpack(args, 2) }, no_new_keys)
end

-- gcra_batch(keys, args): one GCRA policy with a whole-microsecond
-- interval that the fast function takes (library.lua): one GET, the checks
-- in turn on the state's lead over now, and one SET when any admitted.
-- ARGV[1] = "<limit>:<period_us>:<capacity>", ARGV[2] = now or '',
-- ARGV[3..] = the costs. Reply: one integer per
-- check, as the fast function answers alone (the lead before it: ahead
-- when admitted, -1 - ahead when denied); or the status GENERAL, having
-- written nothing, for a state only the general check reads (the client
-- then sends the general batch); or NOROOM from the allow-oom twin.
local batch_policy_of = memo(function(arg)
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
end)
-- The state's lead over now, for gcra_batch and gcra_take: a number, or a
-- status reply (GENERAL for a state only the general check reads, NOROOM
-- for a new key under the allow-oom twin), having written nothing.
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
local function gcra_batch(keys, args, no_new_keys)
  local f = batch_policy_of(args[1])
  if f == nil then
    return redis.error_reply('ERR portcullis: batch GCRA argument is not <limit>:<period_us>:<capacity>; upgrade portcullis-redis')
  end
  local now = now_of(args[2])
  local ahead = batch_lead(keys[1], now, f, no_new_keys)
  if type(ahead) ~= 'number' then
    return ahead
  end
  local replies = {}
  local admitted = false
  for j = 3, #args do
    local cost = tonumber(args[j])
    if cost == nil or cost < 1 or cost > f[4] then
      return redis.error_reply('ERR portcullis: batch GCRA cost is not between 1 and the capacity')
    end
    local span = ahead + cost * f[1]
    if span > f[2] then
      replies[j - 2] = -1 - ahead
    else
      replies[j - 2] = ahead
      ahead = span
      admitted = true
    end
  end
  if admitted then
    put(keys[1], string.format('%x', now + ahead) .. f[5], now + ahead)
  end
  return replies
end
-- gcra_take(keys, args): a rate share for a local budget (budget/): the
-- next emission slots of the state, in order, those whose GCRA time (when
-- the exact check would admit them) lies within the horizon after now, at
-- most ARGV[4] of them, all charged at once. Slot j (from 1) has the GCRA
-- time now + max(0, ahead + j x interval - capacity x interval): the
-- first slots may be due at once (the burst left), the later ones one
-- interval apart. ARGV[1] = "<limit>:<period_us>:<capacity>", ARGV[2] =
-- now or '', ARGV[3] = the asking check's cost (at least that many slots,
-- else none), ARGV[4] = the most slots, ARGV[5] = the horizon in us (the
-- grant period), cut to the clock tolerance beyond the capacity, so that
-- every reader still reads the state (as denying until it comes down).
-- Reply: { n, ahead } with n the slots charged and ahead the state's lead
-- over now before the call; n = 0 (and nothing written) when fewer than
-- ARGV[3] fit. The asking check is admitted when its slots are due at
-- once (ahead + cost x interval <= capacity x interval), which the client
-- derives. GENERAL or NOROOM as gcra_batch.
local function gcra_take(keys, args, no_new_keys)
  local f = batch_policy_of(args[1])
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
redis.register_function{ function_name = FN_GCRA_TAKE,
  callback = function(keys, args) return gcra_take(keys, args, false) end }
redis.register_function{ function_name = FN_GCRA_TAKE_OOM,
  callback = function(keys, args) return gcra_take(keys, args, true) end,
  flags = { 'allow-oom' } }
redis.register_function{ function_name = FN_BATCH,
  callback = function(keys, args) return batch(keys, args, false) end }
redis.register_function{ function_name = FN_BATCH_OOM,
  callback = function(keys, args) return batch(keys, args, true) end,
  flags = { 'allow-oom' } }
redis.register_function{ function_name = FN_GCRA_BATCH,
  callback = function(keys, args) return gcra_batch(keys, args, false) end }
redis.register_function{ function_name = FN_GCRA_BATCH_OOM,
  callback = function(keys, args) return gcra_batch(keys, args, true) end,
  flags = { 'allow-oom' } }
