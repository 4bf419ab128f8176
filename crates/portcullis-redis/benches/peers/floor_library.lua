#!lua name=floor
-- The floor of a rate-limit check in Lua on this server: what any script
-- that reads one key's state and writes it back with an expiry costs,
-- whatever its arithmetic (redis_floor.rs). The shape of a GCRA check
-- (GET, a hexadecimal time, one comparison, SET ... PXAT when admitted),
-- with none of portcullis' exactness, validation or replies: a yardstick,
-- not a limiter.
--
-- one(KEYS[1], ARGV[1] = the interval in µs): one check, TIME read inside.
-- many(KEYS, ARGV[1] = the interval): one check per key, TIME read once.
local function decide(key, now, interval)
  local value = redis.call('GET', key)
  local tat = value and tonumber(value, 16) or now
  if tat < now then
    tat = now
  end
  local new = tat + interval
  if new - now > 100 * interval then
    return -1
  end
  redis.call('SET', key, string.format('%x', new), 'PXAT', math.floor(new / 1000) + 1)
  return new - now
end

local function now_us()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end

redis.register_function('floor_one', function(keys, args)
  return decide(keys[1], now_us(), tonumber(args[1]))
end)

redis.register_function('floor_many', function(keys, args)
  local now, interval = now_us(), tonumber(args[1])
  local replies = {}
  for i = 1, #keys do
    replies[i] = decide(keys[i], now, interval)
  end
  return replies
end)
