-- Redisson-style named rate limiter: GCRA (needs gcra.lua) with its
-- configuration stored in Redis.
--
-- KEYS[1]: the configuration hash (fields rate, interval_us, type).
-- KEYS[2]: the state shared by all clients (type 'overall').
-- KEYS[3]: this client's state (type 'per_client').
-- State values are GCRA states (gcra.lua), limit = capacity = rate,
-- period = interval. Changing the rate keeps them (ALGORITHMS.md: a stored
-- rem >= S is carried into us; a time further ahead than the new rate can
-- leave is clamped).
local op = ARGV[1]
if op == 'try_set' or op == 'set' then
  -- ARGV[2..5]: rate, interval_us, type, keep_alive_ms. Returns 1 when set.
  if op == 'try_set' and redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
  end
  redis.call('HSET', KEYS[1], 'rate', ARGV[2], 'interval_us', ARGV[3], 'type', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return 1
end
if op ~= 'acquire' then
  return redis.error_reply('ERR portcullis: unknown limiter operation')
end
-- ARGV[2]: now in microseconds, or '' to read Redis TIME. ARGV[3]: permits
-- (0 reads and writes nothing). ARGV[4]: keep_alive_ms. ARGV[5..7], when
-- present: the configuration to restore if none is stored.
-- Reply: {status, remaining, retry_after_us, reset_after_us, rate,
-- interval_us, type (1 overall, 2 per client)}; status 1 admitted, 0 denied,
-- -1 no configuration, -2 more permits than the rate.
local config = redis.call('HMGET', KEYS[1], 'rate', 'interval_us', 'type')
local rate, interval, kind = tonumber(config[1]), tonumber(config[2]), config[3]
if rate == nil or interval == nil or (kind ~= 'overall' and kind ~= 'per_client') then
  if ARGV[5] == nil then
    return { -1, 0, -1, 0, 0, 0, 0 }
  end
  rate, interval, kind = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
  redis.call('HSET', KEYS[1], 'rate', ARGV[5], 'interval_us', ARGV[6], 'type', kind)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
local kind_code = 1
local key = KEYS[2]
if kind == 'per_client' then
  kind_code = 2
  key = KEYS[3]
end
local permits = tonumber(ARGV[3])
if permits > rate then
  return { -2, 0, -1, 0, rate, interval, kind_code }
end
local now = now_of(ARGV[2])
local S, I = bucket_scale(rate, interval, rate)
local us, rem = pair_parse(read_string(key), 'gcra', S)
local ok, remaining, retry, reset, _, new_us, new_rem, repair_us, repair_rem = pair_step(us, rem, S, I, rate, now, permits)
if new_us == nil and repair_us ~= nil and permits > 0 then
  -- A time further ahead than this rate can leave (a rate lowered, a
  -- corrupt value): clamped, and written back.
  put(key, pair_value('gcra', repair_us, repair_rem), now + ceil_div(rate * I, S))
end
if new_us ~= nil then
  put(key, pair_value('gcra', new_us, new_rem), now + reset)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
local status = 0
if ok then
  status = 1
end
return { status, remaining, retry, reset, rate, interval, kind_code }
