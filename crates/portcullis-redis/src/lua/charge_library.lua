-- The post-charge's registration in the portcullis Redis Functions library
-- (after library.lua; scripts.rs adds FN_CHARGE and FN_CHARGE_OOM). ARGV[1] names the plan,
-- one letter per policy as plan.lua's CODES (GCRA and the token bucket
-- only); the rest is charge.lua's arguments.
local CHARGE_CODES = { a = CHG.gcra, c = CHG.token_bucket }
local CHARGE_PLANS = {}
local function charge_call(keys, args, no_new_keys)
    local code = args[1]
    local p = CHARGE_PLANS[code]
    if p == nil then
      if type(code) ~= 'string' or #code == 0 or #code > 64 then
        return redis.error_reply('ERR portcullis: unknown charge plan; upgrade portcullis-redis')
      end
      p = {}
      for i = 1, #code do
        local alg = CHARGE_CODES[string.sub(code, i, i)]
        if alg == nil then
          return redis.error_reply('ERR portcullis: this algorithm cannot be charged after the fact; use GCRA or the token bucket')
        end
        p[i] = alg
      end
      CHARGE_PLANS[code] = p
    end
    return charge(p, keys, args, 1, no_new_keys)
end
redis.register_function{ function_name = FN_CHARGE,
  callback = function(keys, args) return charge_call(keys, args, false) end }
-- The allow-oom twin (charge.lua, NO_NEW_KEYS).
redis.register_function{ function_name = FN_CHARGE_OOM,
  callback = function(keys, args) return charge_call(keys, args, true) end,
  flags = { 'allow-oom' } }
