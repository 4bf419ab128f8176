-- The tollgate Redis Functions library's registrations (after the prelude,
-- every algorithm and check.lua; scripts.rs adds the `#!lua name=` line
-- and the versioned function names FN_CHECK, FN_PEEK, FN_OOM, FN_LEASE
-- and FN_LEASE_OOM).
-- Everything above runs once, at FUNCTION LOAD: a call builds no helper.
--
-- ARGV[1] names the plan, one letter per policy (CODES, the order of
-- scripts::CODES in Rust); the rest is check.lua's arguments.
local CODES = { a = ALG.gcra, b = ALG.leaky_queue, c = ALG.token_bucket,
  d = ALG.leaky_meter, e = ALG.fixed_window, f = ALG.sliding_window,
  g = ALG.sliding_log }
-- Plans by their letters, built on first use (a few per deployment).
local PLANS = {}
local function plan(code)
  local p = PLANS[code]
  if p ~= nil then
    return p
  end
  if type(code) ~= 'string' or #code == 0 or #code > 64 then
    return nil
  end
  p = {}
  for i = 1, #code do
    local alg = CODES[string.sub(code, i, i)]
    if alg == nil then
      return nil
    end
    p[i] = alg
  end
  PLANS[code] = p
  return p
end
local function call(keys, args, no_new_keys)
  local p = plan(args[1])
  if p == nil then
    return redis.error_reply('ERR tollgate: unknown plan; upgrade tollgate-redis')
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
