-- The portcullis Redis Functions library's registrations (after the prelude,
-- every algorithm, check.lua and grant.lua, whose own_state the fast
-- functions read; scripts.rs adds the `#!lua name=` line and the
-- versioned function names, FN_CHECK, FN_GCRA and the others).
-- Everything above runs once, at FUNCTION LOAD: a call builds no helper.
--
-- ARGV[1] names the plan, one letter per policy (plan.lua, before this
-- file); the rest is check.lua's arguments.
--
-- memo(parse), parse remembered: a function of a packed argument that parses each
-- argument once (parse(arg), or nil for an argument it refuses, which is
-- not kept) and keeps what it parsed, forgotten past 4096 arguments (a few
-- per deployment). Library only (a script would build it per call); built
-- at load, so a call builds no closure. The fast functions (here,
-- batch.lua, bucket_fast.lua, fixed_window_fast.lua) parse through it.
local function memo(parse)
  local cache, count = {}, 0
  return function(arg)
    local f = cache[arg]
    if f ~= nil then
      return f
    end
    f = parse(arg)
    if f == nil then
      return nil
    end
    if count >= 4096 then
      cache, count = {}, 0
    end
    cache[arg] = f
    count = count + 1
    return f
  end
end

local function call(keys, args, no_new_keys)
  local p = plan(args[1])
  if p == nil then
    return redis.error_reply('ERR portcullis: unknown plan; upgrade portcullis-redis')
  end
  return check(p, keys, args, 1, no_new_keys)
end
redis.register_function{ function_name = FN_CHECK,
  callback = function(keys, args) return call(keys, args, false) end }
-- Peeks (cost 0) write nothing: FCALL_RO, which replicas serve too.
redis.register_function{ function_name = FN_PEEK,
  callback = function(keys, args) return call(keys, args, false) end,
  flags = { 'no-writes' } }
-- The allow-oom twin (check.lua, NO_NEW_KEYS).
redis.register_function{ function_name = FN_OOM,
  callback = function(keys, args) return call(keys, args, true) end,
  flags = { 'allow-oom' } }
-- Leases of concurrency policies (lease.lua): acquire, renew, release.
redis.register_function{ function_name = FN_LEASE,
  callback = function(keys, args) return lease(keys, args, false) end }
-- Its allow-oom twin: renewals and releases run at maxmemory, and an
-- acquire that would create a key answers NOROOM instead.
redis.register_function{ function_name = FN_LEASE_OOM,
  callback = function(keys, args) return lease(keys, args, true) end,
  flags = { 'allow-oom' } }

-- memo() of a fast function's argument "<limit>:<period_us>:<capacity>:<cost>":
-- build(L, P, B, cost, policy) gets the four numbers and the policy part
-- "<limit>:<period_us>:<capacity>" (the general check's argument, for the
-- states it hands on) and returns what the function keeps, or nil to
-- refuse the argument. (Each fast function reads TIME or its client time
-- inline rather than through now_of: a Lua call per check costs more than
-- the few lines it repeats.)
local function memo_fast(build)
  return memo(function(arg)
    local a, b, c, d = string.match(arg, '^(%d+):(%d+):(%d+):(%d+)$')
    if a == nil then
      return nil
    end
    return build(tonumber(a), tonumber(b), tonumber(c), tonumber(d), a .. ':' .. b .. ':' .. c)
  end)
end

-- The one-policy GCRA check (cost >= 1) of a policy whose burst x emission
-- interval is at most 2^52 microseconds and, when the interval is not a
-- whole number of microseconds, whose burst x period is too (ALGORITHMS.md,
-- "The Redis fast path"): the call does only TIME, GET and, when admitted,
-- one SET ... PXAT, and answers one integer, the state's lead over now
-- before the call: ahead when admitted, -1 - ahead when denied; the client
-- derives the decision from it with the same arithmetic
-- (portcullis_core::algorithms::check). When the emission interval is a
-- whole number of microseconds the state is always hexadecimal
-- microseconds and the lead is in microseconds; otherwise (gcra_fraction)
-- the state is us + rem/L and the lead is in units of 1/L microsecond
-- ((us - now) x L + rem). A state it cannot read this way (a
-- foreign value, a remainder from another policy, or a lead the policy
-- cannot leave, to be denied by the reference's arithmetic or repaired) is
-- handed to the general check, whose reply is the usual five integers.
--
-- ARGV[1] = "<limit>:<period_us>:<capacity>:<cost>"; ARGV[2], when
-- present, is now in microseconds (the client-clock mode), else TIME.
local GCRA_PLAN = { ALG.gcra }
local fast_of = memo_fast(function(L, P, B, cost, policy)
  if L < 1 or cost < 1 or cost > B then
    return nil
  end
  if P % L ~= 0 then
    -- Spans in units of 1/L us: a permit is P units, the burst B x P.
    if B * P > MAX then
      return nil
    end
    local reset = ceil_div(B * P, L)
    return { cost * P, B * P, reset + tolerance(reset), policy, cost, L, '@' .. policy }
  end
  -- A whole interval: spans in microseconds, the burst B x ei (B x P may
  -- pass 2^52: a daily quota of 100 000).
  local ei = P / L
  local cap = B * ei
  if cap > MAX then
    return nil
  end
  return { cost * ei, cap, cap + tolerance(cap), policy, cost, nil, '@' .. policy }
end)
-- gcra_fast for an emission interval that is not a whole number of
-- microseconds: the same steps on us + rem/L, the lead answered in units of
-- 1/L microsecond. Every span it forms is at most 2 x B x P <= 2^53, so
-- exact; a state ahead of the burst (span > B x P) goes to the general
-- check, which denies it from the whole and fractional parts apart.
local function gcra_fraction(keys, args, f, now, value, no_new_keys)
  local L = f[6]
  local span = 0
  if value then
    local us, rem
    value = own_state(value, f[7])
    if value ~= nil then
      us = tonumber(value, 16)
      if us ~= nil then
        rem = 0
      else
        local a, b = string.match(value, '^gcra:(%d+):(%d+)$')
        if a ~= nil then
          us, rem = num(a), num(b)
        end
      end
    end
    local readable = us ~= nil and rem ~= nil and us < 2 * MAX and rem < L and us - now <= f[3]
    if readable and us >= now then
      span = (us - now) * L + rem
    end
    if not readable or span > f[2] then
      return check(GCRA_PLAN, keys, { args[2] or '', f[5], f[4] }, 0, no_new_keys)
    end
  elseif no_new_keys then
    return redis.status_reply('NOROOM')
  end
  local new = span + f[1]
  if new > f[2] then
    return -1 - span
  end
  local whole = div(new, L)
  local rem = new - whole * L
  local us = now + whole
  if rem == 0 then
    put(keys[1], string.format('%x', us) .. f[7], us)
  else
    put(keys[1], 'gcra:' .. fmt(us) .. ':' .. fmt(rem) .. f[7], us + 1)
  end
  return span
end
local function gcra_fast(keys, args, no_new_keys)
  local f = fast_of(args[1])
  if f == nil then
    return redis.error_reply('ERR portcullis: fast GCRA argument is not <limit>:<period_us>:<capacity>:<cost>; upgrade portcullis-redis')
  end
  -- now_of (prelude.lua) inlined: the fast path saves the Lua call.
  local now
  if args[2] == nil then
    local time = redis.call('TIME')
    now = time[1] * 1000000 + time[2]
  else
    now = tonumber(args[2])
  end
  local value = redis.pcall('GET', keys[1])
  if f[6] ~= nil then
    return gcra_fraction(keys, args, f, now, value, no_new_keys)
  end
  local ahead = 0
  if value then
    value = own_state(value, f[7])
    local tat = value ~= nil and tonumber(value, 16)
    if not tat or tat >= 2 * MAX or tat - now > f[3] then
      return check(GCRA_PLAN, keys, { args[2] or '', f[5], f[4] }, 0, no_new_keys)
    end
    if tat > now then
      ahead = tat - now
    end
  elseif no_new_keys then
    return redis.status_reply('NOROOM')
  end
  local span = ahead + f[1]
  if span > f[2] then
    return -1 - ahead
  end
  put(keys[1], string.format('%x', now + span) .. f[7], now + span)
  return ahead
end
redis.register_function{ function_name = FN_GCRA,
  callback = function(keys, args) return gcra_fast(keys, args, false) end }
redis.register_function{ function_name = FN_GCRA_OOM,
  callback = function(keys, args) return gcra_fast(keys, args, true) end,
  flags = { 'allow-oom' } }
