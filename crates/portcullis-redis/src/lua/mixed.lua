-- Checks of different subjects (coalesce/lane.rs): the checks that waited
-- on one client while its calls were in flight, whatever their subjects
-- and policies, sent as one call that runs each, in the order given, as
-- the function it would have been sent to alone: one reply per check,
-- exactly what that function answers alone. A check whose function fails
-- gets the status `FAILED <error>` alone (an error inside the array would
-- fail the whole reply at the client); the others are decided as always.
-- (Library only: after every function it names.)
--
-- mixed(keys, args): ARGV[1] = m, the number of checks; then, per check,
-- its function's name, its number of keys, its number of arguments and
-- those arguments; KEYS: every check's keys, in the same order. Keys of
-- one call must share a slot on a Cluster, so the client batches across
-- subjects only on a standalone server (or behind Sentinel).
local MIXED = {
  [FN_CHECK] = call,
  [FN_GCRA] = gcra_fast,
  [FN_GCRA_MULTI] = gcra_multi,
  [FN_TB_FAST] = function(keys, args, no_new_keys)
    return bucket_fast(keys, args, no_new_keys, false)
  end,
  [FN_METER_FAST] = function(keys, args, no_new_keys)
    return bucket_fast(keys, args, no_new_keys, true)
  end,
  [FN_FW_FAST] = fixed_window_fast,
  [FN_SW_FAST] = sliding_window_fast,
  [FN_QUEUE_FAST] = leaky_queue_fast,
  [FN_LOG_FAST] = sliding_log_fast,
}
local function mixed(keys, args, no_new_keys)
  local m = tonumber(args[1])
  if m == nil or m < 1 then
    return redis.error_reply('ERR portcullis: a mixed batch starts with its number of checks; upgrade portcullis-redis')
  end
  local replies = {}
  local a, k = 2, 0
  -- The batch's instant, for the checks sent without a client time (each
  -- function reads now at `at`, ARGV[2] or, for gcra_multi, after its
  -- policies; absent or '' for TIME): one TIME for
  -- the batch, as a batch of one subject reads it once, rather than one
  -- per check (a TIME is a call into Redis; these checks arrived together).
  local now
  -- One table of keys and one of arguments, refilled for each check (the
  -- functions keep nothing of them; whatever one appended is cleared with
  -- the rest): no table per check.
  local check_keys, check_args = {}, {}
  for j = 1, m do
    local run = MIXED[args[a]]
    local nk, na = tonumber(args[a + 1]), tonumber(args[a + 2])
    if run == nil or nk == nil or na == nil or k + nk > #keys or a + 2 + na > #args then
      return redis.error_reply('ERR portcullis: a mixed batch names an unknown function or miscounts; upgrade portcullis-redis')
    end
    refill(check_keys, keys, k, nk)
    refill(check_args, args, a + 2, na)
    local at = args[a] == FN_GCRA_MULTI and nk + 2 or 2
    if check_args[at] == nil or check_args[at] == '' then
      now = batch_now(now)
      check_args[at] = now
    end
    replies[j] = each_reply(pcall(run, check_keys, check_args, no_new_keys))
    k = k + nk
    a = a + 3 + na
  end
  if k ~= #keys or a ~= #args + 1 then
    return redis.error_reply('ERR portcullis: a mixed batch has arguments left over; upgrade portcullis-redis')
  end
  return replies
end
redis.register_function{ function_name = FN_MIXED,
  callback = function(keys, args) return mixed(keys, args, false) end }
redis.register_function{ function_name = FN_MIXED_OOM,
  callback = function(keys, args) return mixed(keys, args, true) end,
  flags = { 'allow-oom' } }
