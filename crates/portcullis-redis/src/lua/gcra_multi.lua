-- gcra_multi(keys, args): a check of several GCRA policies of the fast
-- path (library.lua: whole-microsecond intervals, burst x interval at most
-- 2^52 us) in one call, all or nothing, as check.lua decides it. (Library
-- only: after batch.lua, which defines batch_policy_of, and library.lua.)
--
-- KEYS[i]: policy i's state. ARGV[1] = the cost (at least 1), ARGV[1+i] =
-- policy i as "<limit>:<period_us>:<capacity>", ARGV[2+n], when present,
-- now in microseconds (the client-clock mode), else TIME.
-- Reply: one integer per policy, its state's lead over now before the
-- call: ahead when that policy alone admits the cost, -1 - ahead when it
-- denies; every state is charged (one SET each) only when all admit. A
-- state only the general check reads (to be repaired, or not hexadecimal
-- microseconds) hands the whole check to check.lua in the same call, whose
-- reply is its five integers per policy; so is a new key under the
-- allow-oom twin (NOROOM when it would write one).
local GCRA_PLANS = {}
local function gcra_multi(keys, args, no_new_keys)
  local n = #keys
  local cost = tonumber(args[1])
  if n < 1 or #args < n + 1 or cost == nil or cost < 1 then
    return redis.error_reply('ERR portcullis: gcra_multi takes the cost and one policy per key; upgrade portcullis-redis')
  end
  local now
  if args[n + 2] == nil then
    local time = redis.call('TIME')
    now = time[1] * 1000000 + time[2]
  else
    now = tonumber(args[n + 2])
  end
  local policies, aheads = {}, {}
  local all, general = true, false
  for i = 1, n do
    local f = batch_policy_of(args[1 + i])
    if f == nil or cost > f[4] then
      return redis.error_reply('ERR portcullis: gcra_multi policy ' .. i .. ' is not <limit>:<period_us>:<capacity> of the fast path')
    end
    local value = redis.pcall('GET', keys[i])
    local ahead = 0
    if value then
      value = own_state(value, f[5])
      local tat = value ~= nil and tonumber(value, 16)
      if not tat or tat >= 2 * MAX or tat - now > f[3] then
        general = true
        break
      end
      if tat > now then
        ahead = tat - now
      end
    elseif no_new_keys then
      general = true
      break
    end
    policies[i], aheads[i] = f, ahead
    if ahead + cost * f[1] > f[2] then
      all = false
    end
  end
  if general then
    local plan = GCRA_PLANS[n]
    if plan == nil then
      plan = {}
      for i = 1, n do
        plan[i] = ALG.gcra
      end
      GCRA_PLANS[n] = plan
    end
    local one = { args[n + 2] or '', args[1] }
    for i = 1, n do
      one[2 + i] = args[1 + i]
    end
    return check(plan, keys, one, 0, no_new_keys)
  end
  local reply = {}
  for i = 1, n do
    local f, ahead = policies[i], aheads[i]
    if all then
      local tat = now + ahead + cost * f[1]
      put(keys[i], string.format('%x', tat) .. f[5], tat)
      reply[i] = ahead
    elseif ahead + cost * f[1] > f[2] then
      reply[i] = -1 - ahead
    else
      reply[i] = ahead
    end
  end
  return reply
end
redis.register_function{ function_name = FN_GCRA_MULTI,
  callback = function(keys, args) return gcra_multi(keys, args, false) end }
redis.register_function{ function_name = FN_GCRA_MULTI_OOM,
  callback = function(keys, args) return gcra_multi(keys, args, true) end,
  flags = { 'allow-oom' } }
