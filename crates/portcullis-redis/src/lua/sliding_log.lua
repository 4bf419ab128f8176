-- Sliding log: a sorted set with one member per admitted permit, scored by
-- its time in microseconds. Members are "<time>:<n>", n counting the
-- permits admitted at that same time, so equal times never collide.
local ZADD_CHUNK = 1000

ALG.sliding_log = function(key, L, P, B, now, c)
  local cutoff = now - P -- entries scored <= cutoff have left the window
  local count = redis.pcall('ZCOUNT', key, '(' .. fmt(cutoff), '+inf')
  local foreign = false
  if type(count) ~= 'number' then
    count, foreign = 0, true -- another type: no state
  end
  local newest = nil
  if count > 0 then
    local top = redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES')
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
      local future = redis.call('ZCOUNT', key, '(' .. fmt(now), '+inf')
      if future > 0 then
        redis.call('ZREMRANGEBYSCORE', key, '(' .. fmt(now), '+inf')
        local score = fmt(now)
        local first = redis.call('ZCOUNT', key, score, score) + 1
        for n = first, first + future - 1 do
          redis.call('ZADD', key, score, score .. ':' .. fmt(n))
        end
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
      redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(cutoff))
      local score = fmt(t)
      local first = redis.call('ZCOUNT', key, score, score) + 1
      local last = first + c - 1
      local i = first
      while i <= last do
        local args = {}
        local stop = i + ZADD_CHUNK - 1
        if stop > last then
          stop = last
        end
        for n = i, stop do
          args[#args + 1] = score
          args[#args + 1] = score .. ':' .. fmt(n)
        end
        redis.call('ZADD', key, unpack(args))
        i = stop + 1
      end
      redis.call('PEXPIREAT', key, fmt(ceil_div(t + P, 1000)))
    end
    return { true, L - live - c, -1, reset, 0, nil, nil, nil, commit }
  end
  local k = live + cost - L
  local kth = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(cutoff), '+inf', 'WITHSCORES', 'LIMIT', skip + k - 1, 1)
  local t = tonumber(kth[2])
  if clamped and t > now then
    t = now
  end
  return { false, max0(L - live), t + P - now, reset_after(), 0 }
end
