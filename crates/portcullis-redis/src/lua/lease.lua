-- Leases of a concurrency policy (portcullis-core's algorithms::lease; see
-- ALGORITHMS.md, "Leases"). One subject's leases are one sorted set: a
-- member per lease id, scored by its expiry in microseconds. Every call
-- counts only the leases live at `now` (score > now) and drops the
-- expired ones, so the set holds little else, and the key expires (PEXPIREAT, rounded up to
-- Redis' millisecond) with its last lease: nothing outlives its leases.
--
-- lease(KEYS, ARGV, NO_NEW_KEYS): KEYS[1] the lease set. NO_NEW_KEYS is
-- true for the allow-oom twin (run after Redis refused the call with OOM,
-- at maxmemory + noeviction): an acquire that would create the key
-- answers the status NOROOM, having written nothing.
-- ARGV[1]: 'a' acquire, 'r' renew, 'd' release.
-- ARGV[2]: now in microseconds since the epoch, or '' to read Redis TIME.
-- ARGV[3]: max_in_flight. ARGV[4]: lease_ttl in microseconds.
-- ARGV[5]: the lease id.
-- Reply: { ok (1/0), live leases after the call, expiry_us, now_us }:
-- acquire: ok = granted; expiry_us is the new lease's expiry, or on a
-- denial the earliest live lease's. renew: ok = the lease was live;
-- expiry_us its new expiry (0 when not). release: ok = it was live.

-- Sets the key's expiry to its latest lease's (the set is not empty).
local function lease_expire(key)
  local top = redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES')
  redis.call('PEXPIREAT', key, fmt(ceil_div(tonumber(top[2]), 1000)))
end

local function lease(KEYS, ARGV, NO_NEW_KEYS)
  if #KEYS ~= 1 or #ARGV ~= 5 then
    return redis.error_reply('ERR portcullis: lease called with ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments; upgrade portcullis-redis')
  end
  local key = KEYS[1]
  local now = now_of(ARGV[2])
  local max, ttl, id = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
  if now == nil or max == nil or ttl == nil then
    return redis.error_reply('ERR portcullis: lease arguments are not numbers')
  end
  local op = ARGV[1]
  local cutoff = fmt(now)
  if op == 'd' then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    local removed = redis.call('ZREM', key, id)
    local n = redis.call('ZCARD', key)
    if removed == 1 and n > 0 then
      lease_expire(key)
    end
    return { removed, n, 0, now }
  end
  -- Reads first: the first write of an acquire or a renewal is its ZADD
  -- (a command Redis refuses at maxmemory), so a script call (EVALSHA,
  -- without flags) at maxmemory fails before it has written anything.
  local held = redis.call('ZSCORE', key, id)
  if held and tonumber(held) > now then
    -- Renew (or acquire of an id already live): never shortens.
    local expires = tonumber(held)
    if now + ttl > expires then
      expires = now + ttl
      redis.call('ZADD', key, 'XX', fmt(expires), id)
      lease_expire(key)
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    return { 1, redis.call('ZCARD', key), expires, now }
  end
  local n = redis.call('ZCOUNT', key, '(' .. cutoff, '+inf')
  if op == 'r' then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    return { 0, n, 0, now }
  end
  if op ~= 'a' then
    return redis.error_reply('ERR portcullis: unknown lease operation; upgrade portcullis-redis')
  end
  if n < max then
    if NO_NEW_KEYS and n == 0 then
      return redis.status_reply('NOROOM')
    end
    local expires = now + ttl
    redis.call('ZADD', key, fmt(expires), id)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    lease_expire(key)
    return { 1, n + 1, expires, now }
  end
  local first = redis.call('ZRANGEBYSCORE', key, '(' .. cutoff, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
  return { 0, n, tonumber(first[2]), now }
end
