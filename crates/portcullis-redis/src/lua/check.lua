-- The composed check: PLAN holds one algorithm function per key. Every
-- decision is computed first; state is written only when all admit and
-- the cost is not 0 (a peek).
--
-- check(PLAN, KEYS, ARGV, o, NO_NEW_KEYS): the script calls it with o = 0,
-- a Redis Function with o = 1 (its ARGV[1] names the plan; library.lua).
-- KEYS[i]: the state key of policy i.
-- ARGV[o+1]: now in microseconds since the epoch, or '' to read Redis TIME.
-- ARGV[o+2]: the cost. ARGV[o+2+i]: policy i as
-- "<limit>:<period_us>:<capacity>" (one argument: a library parses it once,
-- prelude.lua's policy_of).
-- Reply: five integers per policy: allowed (1/0), remaining, retry_after_us
-- (-1 for none), reset_after_us, delay_us.
--
-- NO_NEW_KEYS is true for the allow-oom twin (run after Redis refused the
-- check with OOM, at maxmemory + noeviction): it may write keys that
-- exist (held subjects stay exact) but answers the status NOROOM, having
-- written nothing, rather than create one.
-- Writes the new state of each of the n decisions (all admitted).
local function write_all(decisions, n)
  for i = 1, n do
    local d = decisions[i]
    if d[9] ~= nil then
      d[9]()
    elseif d[6] ~= nil then
      redis.call('SET', d[6], d[7], 'PXAT', fmt(ceil_div(d[8], 1000)))
    end
  end
end

-- The reply of n decisions: five integers each.
local function reply_of(decisions, n)
  local reply = {}
  for i = 1, n do
    local d = decisions[i]
    local b = 5 * (i - 1)
    if d[1] then
      reply[b + 1] = 1
    else
      reply[b + 1] = 0
    end
    reply[b + 2] = d[2]
    reply[b + 3] = d[3]
    reply[b + 4] = d[4]
    reply[b + 5] = d[5]
  end
  return reply
end

local function check(PLAN, KEYS, ARGV, o, NO_NEW_KEYS)
  local n = #KEYS
  if n ~= #PLAN or #ARGV ~= o + 2 + n then
    return redis.error_reply('ERR portcullis: script called with ' .. n .. ' keys and ' .. (#ARGV - o) .. ' arguments for ' .. #PLAN .. ' policies')
  end
  local now = now_of(ARGV[o + 1])
  local cost = tonumber(ARGV[o + 2])
  if n == 1 then
    -- One policy (the common case): no table of decisions, and the reply
    -- built in one constructor.
    local L, P, B, tail = policy_of(ARGV[o + 3])
    if L == nil then
      return redis.error_reply('ERR portcullis: policy 1 is not <limit>:<period_us>:<capacity>')
    end
    local d = PLAN[1](KEYS[1], L, P, B, now, cost, tail)
    if d[1] then
      if cost > 0 then
        if d[9] ~= nil then
          if NO_NEW_KEYS and redis.call('EXISTS', KEYS[1]) == 0 then
            return redis.status_reply('NOROOM')
          end
          d[9]()
        elseif d[6] ~= nil then
          if NO_NEW_KEYS and redis.call('EXISTS', KEYS[1]) == 0 then
            return redis.status_reply('NOROOM')
          end
          redis.call('SET', d[6], d[7], 'PXAT', fmt(ceil_div(d[8], 1000)))
        end
      end
      return { 1, d[2], d[3], d[4], d[5] }
    end
    return { 0, d[2], d[3], d[4], d[5] }
  end
  local decisions = {}
  local all = true
  for i = 1, n do
    local L, P, B, tail = policy_of(ARGV[o + 2 + i])
    if L == nil then
      return redis.error_reply('ERR portcullis: policy ' .. i .. ' is not <limit>:<period_us>:<capacity>')
    end
    local d = PLAN[i](KEYS[i], L, P, B, now, cost, tail)
    decisions[i] = d
    if not d[1] then
      all = false
    end
  end
  if not all and cost > 0 then
    -- Nothing is charged, so the policies that would have admitted report
    -- their state as it stays: as a peek does.
    for i = 1, n do
      if decisions[i][1] then
        local L, P, B, tail = policy_of(ARGV[o + 2 + i])
        decisions[i] = PLAN[i](KEYS[i], L, P, B, now, 0, tail)
      end
    end
  end
  if all and cost > 0 then
    if NO_NEW_KEYS then
      for i = 1, n do
        local d = decisions[i]
        if (d[9] ~= nil or d[6] ~= nil) and redis.call('EXISTS', KEYS[i]) == 0 then
          return redis.status_reply('NOROOM')
        end
      end
    end
    write_all(decisions, n)
  end
  return reply_of(decisions, n)
end
