-- sliding_window_fast(keys, args): the fast path of a one-policy sliding
-- window counter check (fast.rs), as gcra is GCRA's: one packed argument,
-- GET, one SET when admitted, one integer back. (Library only: after
-- sliding_window.lua and check.lua.)
--
-- ARGV[1] = "<limit>:<period_us>:<capacity>:<cost>" with (limit + 1)^2 x
-- period at most 2^52 (so the reply below is exact, and the weight unit
-- is 1 us: limit x period is at most 2^50) and a cost from 1 to the limit;
-- ARGV[2], when present, now in microseconds (the client-clock mode), else
-- TIME. Reply: (previous x (limit + 1) + current) x period + elapsed, where
-- previous and current are the counts the check weighed (the stored
-- window's, or its current count as the previous one when it is the window
-- just before now's) and elapsed the time since now's window began: that
-- when admitted, -1 - that when denied; the client derives the decision
-- from it (algorithms::check on those counts, elapsed into the window). A
-- state the fast path does not read as plain (a window that starts after
-- now's, a count over the limit, another form or type) is handed to the
-- general check in the same call, whose reply is the usual five integers;
-- so is a new key under the allow-oom twin.
local sw_fast_of = memo_fast(function(L, P, _, cost, policy)
  if L < 1 or P < 1 or (L + 1) * (L + 1) * P > MAX or cost < 1 or cost > L then
    return nil
  end
  return { L, P, cost, policy }
end)
local SW_PLAN = { ALG.sliding_window }
local function sliding_window_fast(keys, args, no_new_keys)
  local f = sw_fast_of(args[1])
  if f == nil then
    return redis.error_reply('ERR portcullis: fast sliding window argument is not <limit>:<period_us>:<capacity>:<cost>; upgrade portcullis-redis')
  end
  local L, P, cost = f[1], f[2], f[3]
  local now
  if args[2] == nil then
    local time = redis.call('TIME')
    now = time[1] * 1000000 + time[2]
  else
    now = tonumber(args[2])
  end
  local ws = now - now % P
  local prev, curr = 0, 0
  local value = redis.pcall('GET', keys[1])
  if value then
    local s_ws, s_prev, s_curr
    if type(value) == 'string' then
      local a, b, d = string.match(value, '^sliding_window:(%d+):(%d+):(%d+)$')
      if a ~= nil then
        s_ws, s_prev, s_curr = num(a), num(b), num(d)
      end
    end
    if s_ws == nil or s_prev == nil or s_curr == nil or s_ws > ws then
      return check(SW_PLAN, keys, { args[2] or '', cost, f[4] }, 0, no_new_keys)
    end
    if s_ws == ws then
      if s_prev > L or s_curr > L then
        return check(SW_PLAN, keys, { args[2] or '', cost, f[4] }, 0, no_new_keys)
      end
      prev, curr = s_prev, s_curr
    elseif s_ws + P == ws then
      if s_curr > L then
        return check(SW_PLAN, keys, { args[2] or '', cost, f[4] }, 0, no_new_keys)
      end
      prev = s_curr
    end
    -- An older window: both counts 0.
  elseif no_new_keys then
    return check(SW_PLAN, keys, { args[2] or '', cost, f[4] }, 0, no_new_keys)
  end
  local e = now - ws
  local reply = (prev * (L + 1) + curr) * P + e
  if curr + cost <= L and prev * (P - e) <= (L - curr - cost) * P then
    put(keys[1], string.format('sliding_window:%d:%d:%d', ws, prev, curr + cost), ws + 2 * P)
    return reply
  end
  return -1 - reply
end
redis.register_function{ function_name = FN_SW_FAST,
  callback = function(keys, args) return sliding_window_fast(keys, args, false) end }
redis.register_function{ function_name = FN_SW_FAST_OOM,
  callback = function(keys, args) return sliding_window_fast(keys, args, true) end,
  flags = { 'allow-oom' } }
