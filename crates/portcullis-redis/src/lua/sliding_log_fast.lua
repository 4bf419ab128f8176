-- sliding_log_fast(keys, args): the fast path of a one-policy sliding log
-- check (fast.rs): one packed argument and only the reads the plain case
-- needs, without check.lua's tables. (Library only: after sliding_log.lua
-- and check.lua.) ZCARD less the ZCOUNT of the expired entries counts the
-- live ones, reading only the expired (sliding_log.lua). Admitted: a
-- ZCOUNT from now on (which reads only the newest entry when it is
-- before now), the expired entries removed (when there are any), the new
-- ones added, PEXPIREAT. Denied: ZREVRANGE for the newest entry and for
-- the entry whose leaving admits the request (by rank: L - cost). The
-- state is the general check's sorted set, written the same way. Numbers
-- reach redis.call as strings (fmt: '%d', not %.17g).
--
-- ARGV[1] = "<limit>:<period_us>:<capacity>:<cost>" (cost from 1 to the
-- limit); ARGV[2], when present, now in microseconds (the client-clock
-- mode), else TIME. Reply: when admitted, one integer, the live entries
-- before the check (the client derives the decision: remaining limit -
-- live - cost, reset after one period); when denied, the general check's
-- five integers (allowed 0, remaining, retry_after_us, reset_after_us,
-- delay_us 0). A log with more live entries than the limit or an entry at
-- or after now (to be clamped, or numbered after those at now), or a key
-- of another type, is handed to the general check in the same call
-- (five integers); so is a new key under the allow-oom twin.
local log_fast_of = memo_fast(function(L, P, _, cost, policy)
  if L < 1 or P < 1 or cost < 1 or cost > L then
    return nil
  end
  return { L, P, cost, policy, string.format('%d', L - cost) }
end)
local LOG_PLAN = { ALG.sliding_log }
local function sliding_log_fast(keys, args, no_new_keys)
  local f = log_fast_of(args[1])
  if f == nil then
    return redis.error_reply('ERR portcullis: fast sliding log argument is not <limit>:<period_us>:<capacity>:<cost>; upgrade portcullis-redis')
  end
  local L, P, c = f[1], f[2], f[3]
  local now
  if args[2] == nil then
    local time = redis.call('TIME')
    now = time[1] * 1000000 + time[2]
  else
    now = tonumber(args[2])
  end
  local key = keys[1]
  local cutoff = fmt(now - P) -- entries scored <= cutoff have left the window
  local live, dead = 0, 0
  local card = redis.pcall('ZCARD', key)
  if type(card) ~= 'number' or (card == 0 and no_new_keys) then
    return check(LOG_PLAN, keys, { args[2] or '', c, f[4] }, 0, no_new_keys)
  end
  if card > 0 then
    dead = redis.call('ZCOUNT', key, '-inf', cutoff)
    live = card - dead
  end
  if live + c <= L then
    local score = fmt(now)
    -- An entry at now or after it (the last one's score, read first):
    -- the general check numbers the new entries after those at now, or
    -- clamps.
    if live > 0 and redis.call('ZCOUNT', key, score, '+inf') > 0 then
      return check(LOG_PLAN, keys, { args[2] or '', c, f[4] }, 0, no_new_keys)
    end
    if dead > 0 then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    end
    log_add(key, now, score, 1, c, P)
    return live
  end
  if live > L then
    return check(LOG_PLAN, keys, { args[2] or '', c, f[4] }, 0, no_new_keys)
  end
  local top = redis.call('ZREVRANGE', key, '0', '0', 'WITHSCORES')
  local newest = tonumber(top[2])
  if newest == nil or newest > now then
    return check(LOG_PLAN, keys, { args[2] or '', c, f[4] }, 0, no_new_keys)
  end
  -- The (live + c - L)th live entry, counted from the oldest, is the
  -- (L - c)th from the newest (rank 0): no score range to parse.
  local kth = redis.call('ZREVRANGE', key, f[5], f[5], 'WITHSCORES')
  return { 0, L - live, tonumber(kth[2]) + P - now, newest + P - now, 0 }
end
redis.register_function{ function_name = FN_LOG_FAST,
  callback = function(keys, args) return sliding_log_fast(keys, args, false) end }
redis.register_function{ function_name = FN_LOG_FAST_OOM,
  callback = function(keys, args) return sliding_log_fast(keys, args, true) end,
  flags = { 'allow-oom' } }
