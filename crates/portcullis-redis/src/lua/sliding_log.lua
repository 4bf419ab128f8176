-- Sliding log: a sorted set with one member per admitted permit, scored by
-- its time in microseconds. Members are "<time>:<n>", n counting the
-- permits admitted at that same time, so equal times never collide.
--
-- The reads touch only the entries that have left the window (the oldest:
-- a set of up to 128 entries is one listpack, which Redis reads from its
-- start) and the newest: ZCARD less the ZCOUNT of the expired entries
-- counts the live ones, where a ZCOUNT of the live ones, or of the
-- members at one time, would read every live entry.
local ZADD_CHUNK = 1000

-- Adds c entries at the string score `score`, numbered from first (the
-- entries at that time so far + 1). A clamp that dropped the oldest
-- entries (ZREMRANGEBYRANK, which orders equal scores by member) can leave
-- a gap in the numbers, so a number may already be taken: ZADD NX skips
-- it, and the next numbers are tried until c entries were added (at most
-- the limit more tries).
local function log_put(key, score, first, c)
  local added, n = 0, first
  while added < c do
    local want = c - added
    if want > ZADD_CHUNK then
      want = ZADD_CHUNK
    end
    local args = { 'NX' }
    for j = n, n + want - 1 do
      args[#args + 1] = score
      args[#args + 1] = score .. ':' .. fmt(j)
    end
    added = added + redis.call('ZADD', key, unpack(args))
    n = n + want
  end
end

-- Adds c entries at time t (its string score), numbered from first (the
-- entries at t so far + 1), and sets the key to expire when they leave
-- the window (t + P).
local function log_add(key, t, score, first, c, P)
  log_put(key, score, first, c)
  redis.call('PEXPIREAT', key, fmt(ceil_div(t + P, 1000)))
end

ALG.sliding_log = function(key, L, P, B, now, c)
  local cutoff = now - P -- entries scored <= cutoff have left the window
  local count, dead = 0, 0
  local foreign = false
  local card = redis.pcall('ZCARD', key)
  if type(card) ~= 'number' then
    foreign = true -- another type: no state
  elseif card > 0 then
    dead = redis.call('ZCOUNT', key, '-inf', fmt(cutoff))
    count = card - dead
  end
  local newest = nil
  if count > 0 then
    local top = redis.call('ZREVRANGE', key, '0', '0', 'WITHSCORES')
    newest = tonumber(top[2])
  end
  -- A log with entries later than clocks that disagree explain (a clock
  -- that jumped back, a corrupt value) or more live entries than L (a limit
  -- that shrank) is read as its newest L live entries, none after now, and
  -- written so on a charge.
  -- `skip` live entries (the oldest) are left out of the view.
  local skip = 0
  if count > L then
    skip = count - L
  end
  local clamped = newest ~= nil and (newest - now > tolerance(P) or skip > 0)
  if clamped then
    if c > 0 then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(cutoff))
      dead = 0
      local future = redis.call('ZCOUNT', key, '(' .. fmt(now), '+inf')
      if future > 0 then
        redis.call('ZREMRANGEBYSCORE', key, '(' .. fmt(now), '+inf')
        local score = fmt(now)
        log_put(key, score, redis.call('ZCOUNT', key, score, score) + 1, future)
      end
      if skip > 0 then
        redis.call('ZREMRANGEBYRANK', key, 0, -(L + 1))
      end
      if newest > now then
        newest = now
      end
      redis.call('PEXPIREAT', key, fmt(ceil_div(newest + P, 1000)))
      count, skip = count - skip, 0
    else
      if newest > now then
        newest = now
      end
    end
  end
  local function reset_after()
    if newest == nil then
      return 0
    end
    return newest + P - now
  end
  local cost = c
  if c == 0 then
    cost = 1
  end
  local live = count - skip
  if live + cost <= L then
    if c == 0 then
      return { true, L - live, -1, reset_after(), 0 }
    end
    local t = now
    if newest ~= nil and newest > t then
      t = newest
    end
    local reset = t + P - now
    local commit = function()
      if foreign then
        redis.call('DEL', key)
      end
      if dead > 0 then
        redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(cutoff))
      end
      local score = fmt(t)
      -- Entries at t exist only when the newest is at t (t is now or the
      -- newest, whichever is later).
      local first = 1
      if newest ~= nil and newest >= t then
        first = redis.call('ZCOUNT', key, score, score) + 1
      end
      log_add(key, t, score, first, c, P)
    end
    return { true, L - live - c, -1, reset, 0, nil, nil, nil, commit }
  end
  local k = live + cost - L
  local kth = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(cutoff), '+inf', 'WITHSCORES', 'LIMIT', fmt(skip + k - 1), '1')
  local t = tonumber(kth[2])
  if clamped and t > now then
    t = now
  end
  return { false, max0(L - live), t + P - now, reset_after(), 0 }
end
