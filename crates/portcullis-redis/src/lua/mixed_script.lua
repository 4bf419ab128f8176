-- Checks of different subjects on the EVALSHA path (coalesce/lane.rs):
-- the checks that waited on one client while its calls were in flight,
-- whatever their subjects and policies, sent as one EVALSHA of this
-- script, which decides each, in the order given, as the check script
-- composed for its policy set decides it alone (mixed.lua's loop, for a
-- server that refuses Functions). One reply per check, exactly what its
-- check script answers alone; a check whose check fails gets the status
-- `FAILED <error>` alone (an error inside the array would fail the whole
-- reply at the client), and the others are decided as always. (A script
-- of its own: after the prelude, every algorithm, check.lua, plan.lua and
-- batch_each.lua.)
--
-- mixed_script(keys, args, no_new_keys): ARGV[1] = m, the number of
-- checks; then runs of consecutive checks of one plan with the same
-- counts: the plan (one letter per policy, plan.lua), the number of keys
-- and of arguments of each check, the number of checks, then each check's
-- arguments (the check script's: now or '', the cost, the policies;
-- batch_each.lua); KEYS: every check's keys, in the same order.
-- Standalone servers and Sentinel only, as mixed.lua.
--
-- A write Redis refuses for the server's state (OOM at maxmemory, READONLY
-- on a replica, NOREPLICAS, MISCONF) fails the whole call, as it fails a
-- check script alone: Redis refuses only a script's first write so (its
-- state cannot change while a script runs), so nothing was written, and
-- the client answers as for a check alone (OOM: the allow-oom twin, the
-- whole batch once more). A function is refused so before it runs.

-- Errors of a write refused for the server's state (see above).
local REFUSED_WRITES = { 'OOM command not allowed', 'READONLY', 'NOREPLICAS', 'MISCONF' }
local function refused_write(failed)
  local text = tostring(type(failed) == 'table' and failed.err or failed)
  for _, refusal in ipairs(REFUSED_WRITES) do
    if string.find(text, refusal, 1, true) then
      return true
    end
  end
  return false
end

local function known(letters)
  return plan(letters) ~= nil
end
local function mixed_script(keys, args, no_new_keys)
  -- Every run's plan and counts read before any check runs: a call
  -- refused here wrote nothing.
  local bad = batch_error(keys, args, known, 'plan')
  if bad ~= nil then
    return bad
  end
  local m = tonumber(args[1])
  local replies = {}
  local a, k, j = 2, 0, 0
  -- The batch's instant, for the checks sent without a client time (ARGV[1]
  -- of a check script, '' for TIME): one TIME for the batch, as mixed.lua
  -- reads it.
  local now
  -- One table of keys and one of arguments, refilled for each check.
  local check_keys, check_args = {}, {}
  while j < m do
    local p = plan(args[a])
    local nk, na, n = tonumber(args[a + 1]), tonumber(args[a + 2]), tonumber(args[a + 3])
    a = a + 4
    for _ = 1, n do
      j = j + 1
      refill(check_keys, keys, k, nk)
      refill(check_args, args, a - 1, na)
      if check_args[1] == '' then
        now = batch_now(now)
        check_args[1] = now
      end
      local ok, reply = pcall(check, p, check_keys, check_args, 0, no_new_keys)
      if not ok and refused_write(reply) then
        error(reply, 0)
      end
      replies[j] = each_reply(ok, reply)
      k = k + nk
      a = a + na
    end
  end
  return replies
end
