-- Checks of different subjects (coalesce/lane.rs): the checks that waited
-- on one client while its calls were in flight, whatever their subjects
-- and policies, sent as one call that runs each, in the order given, as
-- the function it would have been sent to alone: one reply per check,
-- exactly what that function answers alone. A check whose function fails
-- gets the status `FAILED <error>` alone (an error inside the array would
-- fail the whole reply at the client); the others are decided as always.
-- (Library only: after every function it names.)
--
-- mixed(keys, args): ARGV[1] = m, the number of checks; then runs of
-- consecutive checks sent to one function with the same counts: the
-- function's name, the number of keys and of arguments of each check, the
-- number of checks, then each check's arguments (batch_each.lua); KEYS:
-- every check's keys, in the same order. Keys of one call must share a
-- slot on a Cluster, so the client batches across subjects only on a
-- standalone server (or behind Sentinel).
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
local function known(name)
  return MIXED[name] ~= nil
end
local function mixed(keys, args, no_new_keys)
  -- Every run's counts read before any check runs: a malformed batch is
  -- an error reply having written nothing.
  local bad = batch_error(keys, args, known, 'function')
  if bad ~= nil then
    return bad
  end
  local m = tonumber(args[1])
  local replies = {}
  local a, k, j = 2, 0, 0
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
  while j < m do
    local name = args[a]
    local run = MIXED[name]
    local nk, na, n = tonumber(args[a + 1]), tonumber(args[a + 2]), tonumber(args[a + 3])
    local at = name == FN_GCRA_MULTI and nk + 2 or 2
    a = a + 4
    for _ = 1, n do
      j = j + 1
      refill(check_keys, keys, k, nk)
      refill(check_args, args, a - 1, na)
      if check_args[at] == nil or check_args[at] == '' then
        now = batch_now(now)
        check_args[at] = now
      end
      replies[j] = each_reply(pcall(run, check_keys, check_args, no_new_keys))
      k = k + nk
      a = a + na
    end
  end
  return replies
end
redis.register_function{ function_name = FN_MIXED,
  callback = function(keys, args) return mixed(keys, args, false) end }
redis.register_function{ function_name = FN_MIXED_OOM,
  callback = function(keys, args) return mixed(keys, args, true) end,
  flags = { 'allow-oom' } }
