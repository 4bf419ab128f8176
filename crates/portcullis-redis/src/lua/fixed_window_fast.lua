-- fixed_window_fast(keys, args): the fast path of a one-policy fixed
-- window check (fast.rs), as gcra is GCRA's: one packed argument, GET,
-- one SET when admitted, one integer back. (Library only: after
-- fixed_window.lua and check.lua.)
--
-- ARGV[1] = "<limit>:<period_us>:<capacity>:<cost>" with limit x period
-- at most 2^52 and a cost of at least 1; ARGV[2], when present, now in
-- microseconds (the client-clock mode), else TIME. Reply: count x period +
-- elapsed, where count is what the current window held before the check
-- and elapsed the time since the window began: that when admitted, -1 -
-- that when denied; the client derives the decision from it. A state the
-- fast path does not read as plain (a later window, a count over the
-- limit, another form or type) is handed to the general check in the same
-- call, whose reply is the usual five integers; so is a new key under the
-- allow-oom twin.
local fw_fast_of = memo_fast(function(L, P, _, cost, policy)
  if L < 1 or P < 1 or L * P > MAX or cost < 1 or cost > L then
    return nil
  end
  return { L, P, cost, policy }
end)
local FW_PLAN = { ALG.fixed_window }
local function fixed_window_fast(keys, args, no_new_keys)
  local f = fw_fast_of(args[1])
  if f == nil then
    return redis.error_reply('ERR portcullis: fast fixed window argument is not <limit>:<period_us>:<capacity>:<cost>; upgrade portcullis-redis')
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
  local count = 0
  local value = redis.pcall('GET', keys[1])
  if value then
    local s_ws, s_count
    if type(value) == 'string' then
      local a, b = string.match(value, '^fixed_window:(%d+):(%d+)$')
      if a ~= nil then
        s_ws, s_count = num(a), num(b)
      end
    end
    if s_ws == nil or s_count == nil or s_ws > ws or (s_ws == ws and s_count > L) then
      return check(FW_PLAN, keys, { args[2] or '', cost, f[4] }, 0, no_new_keys)
    end
    if s_ws == ws then
      count = s_count
    end
  elseif no_new_keys then
    return check(FW_PLAN, keys, { args[2] or '', cost, f[4] }, 0, no_new_keys)
  end
  local reply = count * P + (now - ws)
  if count + cost <= L then
    put(keys[1], 'fixed_window:' .. fmt(ws) .. ':' .. fmt(count + cost), ws + P)
    return reply
  end
  return -1 - reply
end
redis.register_function{ function_name = FN_FW_FAST,
  callback = function(keys, args) return fixed_window_fast(keys, args, false) end }
redis.register_function{ function_name = FN_FW_FAST_OOM,
  callback = function(keys, args) return fixed_window_fast(keys, args, true) end,
  flags = { 'allow-oom' } }
