-- Coalesced checks on the EVALSHA path (coalesce/decide.rs): the checks
-- of one subject and policies that waited while a call for them was in
-- flight, decided in turn in one call of a script composed for their
-- policy set (after check.lua, as the check script is), each as if called
-- alone at the same instant: batch.lua's general batch, for a server that
-- refuses Functions (Redis 6.2, a full node, an ACL without FCALL); the
-- library's general batch (batch.lua) runs it too, after its plan.
--
-- batch_script(PLAN, KEYS, ARGV, NO_NEW_KEYS): ARGV[1] = now or '' (TIME,
-- read once), ARGV[2] = n, the number of checks, ARGV[2+j] = the cost of
-- check j, ARGV[3+n..] = the policies, as check.lua takes them (o = 0).
-- Reply: n replies, each what the check script answers alone (five
-- integers per policy, or the status NOROOM from the allow-oom twin).
local function batch_script(plan, keys, args, no_new_keys)
  local n = tonumber(args[2])
  if n == nil or n < 1 or #args ~= 2 + n + #keys then
    return redis.error_reply('ERR portcullis: batch of ' .. tostring(args[2]) .. ' checks called with ' .. #args .. ' arguments')
  end
  -- One check's arguments (check.lua, o = 0): now, cost, policies.
  local one = { fmt(now_of(args[1])), '' }
  for i = 1, #keys do
    one[2 + i] = args[2 + n + i]
  end
  local replies = {}
  for j = 1, n do
    one[2] = args[2 + j]
    local reply = check(plan, keys, one, 0, no_new_keys)
    if type(reply) == 'table' and reply.err ~= nil then
      -- Arguments it refuses are the same for every check: the first
      -- check answers it, and nothing was written.
      return reply
    end
    replies[j] = reply
  end
  return replies
end
