-- Coalesced checks (coalesce.rs): the checks of one subject and policies
-- that waited on one client while a call for them was in flight, sent as
-- one call that decides them one after another, in the order given, as if
-- each had been called alone at the same instant. One reply per check.
-- (Library only: after plan.lua, which defines plan(), grant.lua, which
-- defines gcra_policy, batch_lead and gcra_take, registered here,
-- library.lua, which defines GCRA_PLAN, and batch_script.lua.)
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
-- batch_policy_of: grant.lua's gcra_policy, each argument parsed once.
local batch_policy_of = memo(gcra_policy)
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
-- The grant of a rate share (grant.lua).
redis.register_function{ function_name = FN_GCRA_TAKE,
  callback = function(keys, args) return gcra_take(keys, args, false, batch_policy_of) end }
redis.register_function{ function_name = FN_GCRA_TAKE_OOM,
  callback = function(keys, args) return gcra_take(keys, args, true, batch_policy_of) end,
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
