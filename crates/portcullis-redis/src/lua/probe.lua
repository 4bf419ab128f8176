-- The permission probe RedisStoreBuilder::build runs once (verify.rs): it
-- calls every command portcullis's scripts call, on three keys of the
-- store's prefix that it deletes again in the same atomic step, so an ACL
-- user missing one is refused at build() and not, silently, later (the
-- state read is a pcall that treats a failure as "no state").
-- KEYS[1..3]: a string, a sorted set and a hash key, one hash tag.
-- Reply: 1, or {command, error} for the first command refused.
local function try(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    return reply.err
  end
  return nil
end
local calls = {
  {'DEL', KEYS[1], KEYS[2], KEYS[3]},
  {'TIME'},
  {'SET', KEYS[1], 'probe'},
  {'GET', KEYS[1]},
  {'EXISTS', KEYS[1]},
  {'PEXPIRE', KEYS[1], '60000'},
  {'PEXPIREAT', KEYS[1], '99999999999999'},
  {'ZADD', KEYS[2], '1', 'probe'},
  {'ZCOUNT', KEYS[2], '0', '2'},
  {'ZRANGEBYSCORE', KEYS[2], '0', '2'},
  {'ZREVRANGE', KEYS[2], '0', '0'},
  {'ZSCORE', KEYS[2], 'probe'},
  {'ZCARD', KEYS[2]},
  {'ZREM', KEYS[2], 'probe'},
  {'ZREMRANGEBYRANK', KEYS[2], '0', '-2'},
  {'ZREMRANGEBYSCORE', KEYS[2], '0', '2'},
  {'HSET', KEYS[3], 'probe', '1'},
  {'HMGET', KEYS[3], 'probe'},
  {'DEL', KEYS[1], KEYS[2], KEYS[3]},
}
for _, call in ipairs(calls) do
  local err = try(unpack(call))
  if err then
    redis.pcall('DEL', KEYS[1], KEYS[2], KEYS[3])
    return {call[1], err}
  end
end
return 1
