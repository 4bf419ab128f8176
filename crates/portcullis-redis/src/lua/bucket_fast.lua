-- bucket_fast(keys, args, meter): the fast path of a one-policy token
-- bucket check, or with meter = true of a leaky bucket meter (fast.rs),
-- as gcra is GCRA's: one packed argument, GET, one SET when admitted, and
-- one integer back, from which the client derives the decision with the
-- core's own arithmetic. (Library only: after token_bucket.lua,
-- leaky_meter.lua and check.lua.) A meter's level is its water: it drains
-- instead of refilling, and admits while the water and the cost fit.
--
-- ARGV[1] = "<limit>:<period_us>:<capacity>:<cost>" (cost at least 1);
-- ARGV[2], when present, now in microseconds (the client-clock mode), else
-- TIME. Reply: the bucket's level (in units, token_bucket.lua and
-- leaky_meter.lua) after the refill (the drain) up to now and before the
-- charge: level when admitted, -1 - level when denied. A state the fast path does not read as plain (a level over
-- full, a last refill after now, another form or type) is handed to the
-- general check in the same call, whose reply is the usual five integers;
-- so is a new key under the allow-oom twin.
local tb_fast_of = memo_fast(function(L, P, B, cost, policy)
  if L < 1 or P < 1 or B < 1 or cost < 1 or cost > B then
    return nil
  end
  local S, I = bucket_scale(L, P, B)
  return { S, I, B * I, cost * I, cost, policy, '@' .. policy }
end)
local TB_PLAN = { ALG.token_bucket }
local METER_PLAN = { ALG.leaky_meter }
local function bucket_fast(keys, args, no_new_keys, meter)
  local f = tb_fast_of(args[1])
  if f == nil then
    return redis.error_reply('ERR portcullis: fast token bucket argument is not <limit>:<period_us>:<capacity>:<cost>; upgrade portcullis-redis')
  end
  local S, I, full, need = f[1], f[2], f[3], f[4]
  local plan, form = TB_PLAN, '^token_bucket:(%d+):(%d+)$'
  if meter then
    plan, form = METER_PLAN, '^leaky_meter:(%d+):(%d+)$'
  end
  local now
  if args[2] == nil then
    local time = redis.call('TIME')
    now = time[1] * 1000000 + time[2]
  else
    now = tonumber(args[2])
  end
  local level = full
  if meter then
    level = 0
  end
  local value = redis.pcall('GET', keys[1])
  if value then
    local l, t
    value = own_state(value, f[7])
    if value ~= nil then
      local a, b = string.match(value, form)
      if a ~= nil then
        l, t = num(a), num(b)
      end
    end
    if l == nil or t == nil or l > full or t > now then
      return check(plan, keys, { args[2] or '', f[5], f[6] }, 0, no_new_keys)
    end
    level = l
    if now > t then
      if meter then
        if now - t >= ceil_div(level, S) then
          level = 0
        else
          level = level - (now - t) * S
        end
      elseif now - t >= ceil_div(full - level, S) then
        level = full
      else
        level = level + (now - t) * S
      end
    end
  elseif no_new_keys then
    return check(plan, keys, { args[2] or '', f[5], f[6] }, 0, no_new_keys)
  end
  if meter then
    if level + need <= full then
      local new_level = level + need
      put(keys[1], 'leaky_meter:' .. fmt(new_level) .. ':' .. fmt(now) .. f[7], now + ceil_div(new_level, S))
      return level
    end
  elseif level >= need then
    local new_level = level - need
    put(keys[1], 'token_bucket:' .. fmt(new_level) .. ':' .. fmt(now) .. f[7], now + ceil_div(full - new_level, S))
    return level
  end
  return -1 - level
end
redis.register_function{ function_name = FN_TB_FAST,
  callback = function(keys, args) return bucket_fast(keys, args, false, false) end }
redis.register_function{ function_name = FN_TB_FAST_OOM,
  callback = function(keys, args) return bucket_fast(keys, args, true, false) end,
  flags = { 'allow-oom' } }
redis.register_function{ function_name = FN_METER_FAST,
  callback = function(keys, args) return bucket_fast(keys, args, false, true) end }
redis.register_function{ function_name = FN_METER_FAST_OOM,
  callback = function(keys, args) return bucket_fast(keys, args, true, true) end,
  flags = { 'allow-oom' } }
