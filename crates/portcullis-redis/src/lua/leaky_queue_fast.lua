-- leaky_queue_fast(keys, args): the fast path of a one-policy leaky bucket
-- queue check (fast.rs): GCRA's fast function (library.lua) on the queue's
-- own state, for the same policies (an emission interval of whole
-- microseconds, burst x interval at most 2^52, a cost from 1 to the burst).
-- (Library only: after library.lua.) The state's time is then always
-- whole microseconds, "leaky_queue:<us>:0", and the call does only TIME,
-- GET and, when admitted, one SET ... PXAT.
--
-- ARGV[1] = "<limit>:<period_us>:<capacity>:<cost>"; ARGV[2], when
-- present, now in microseconds (the client-clock mode), else TIME. Reply:
-- the time until the queue is free before the call (the admitted
-- request's delay): ahead when admitted, -1 - ahead when denied; the
-- client derives the decision from it. A state it does not read this way
-- (a remainder, another form or type, a time further ahead than the clock
-- tolerance allows, to be repaired) is handed to the general check in the
-- same call, whose reply is the usual five integers; so is a new key under
-- the allow-oom twin.
local QUEUE_PLAN = { ALG.leaky_queue }
local function leaky_queue_fast(keys, args, no_new_keys)
  local f = fast_of(args[1])
  -- f[6] is set for an interval that is not a whole number of
  -- microseconds (gcra_fraction's policies), which this function never
  -- takes.
  if f == nil or f[6] ~= nil then
    return redis.error_reply('ERR portcullis: fast leaky queue argument is not <limit>:<period_us>:<capacity>:<cost>; upgrade portcullis-redis')
  end
  local now
  if args[2] == nil then
    local time = redis.call('TIME')
    now = time[1] * 1000000 + time[2]
  else
    now = tonumber(args[2])
  end
  local value = redis.pcall('GET', keys[1])
  local ahead = 0
  if value then
    local free
    value = own_state(value, f[7])
    if value ~= nil then
      local a = string.match(value, '^leaky_queue:(%d+):0$')
      if a ~= nil then
        free = num(a)
      end
    end
    if free == nil or free - now > f[3] then
      return check(QUEUE_PLAN, keys, { args[2] or '', f[5], f[4] }, 0, no_new_keys)
    end
    if free > now then
      ahead = free - now
    end
  elseif no_new_keys then
    return check(QUEUE_PLAN, keys, { args[2] or '', f[5], f[4] }, 0, no_new_keys)
  end
  local span = ahead + f[1]
  if span > f[2] then
    return -1 - ahead
  end
  put(keys[1], string.format('leaky_queue:%d:0', now + span) .. f[7], now + span)
  return ahead
end
redis.register_function{ function_name = FN_QUEUE_FAST,
  callback = function(keys, args) return leaky_queue_fast(keys, args, false) end }
redis.register_function{ function_name = FN_QUEUE_FAST_OOM,
  callback = function(keys, args) return leaky_queue_fast(keys, args, true) end,
  flags = { 'allow-oom' } }
