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
  if count + cost <= L then
    if c == 0 then
      return { true, L - count, -1, reset_after(), 0 }
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
    return { true, L - count - c, -1, reset, 0, nil, nil, nil, commit }
  end
  local k = count + cost - L
  local kth = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(cutoff), '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
  return { false, max0(L - count), tonumber(kth[2]) + P - now, reset_after(), 0 }
end
