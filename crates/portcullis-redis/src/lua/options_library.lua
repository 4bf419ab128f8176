-- The check with options' registration in the portcullis Redis Functions
-- library (after library.lua; it shares plan.lua's plan(); scripts.rs adds
-- FN_EXT and FN_EXT_OOM). ARGV[1] names the plan; the rest is
-- options.lua's arguments.
local function ext_call(keys, args, no_new_keys)
  local p = plan(args[1])
  if p == nil then
    return redis.error_reply('ERR portcullis: unknown plan; upgrade portcullis-redis')
  end
  return check_ext(p, keys, args, 1, no_new_keys)
end
redis.register_function{ function_name = FN_EXT,
  callback = function(keys, args) return ext_call(keys, args, false) end }
-- The allow-oom twin (options.lua, NO_NEW_KEYS).
redis.register_function{ function_name = FN_EXT_OOM,
  callback = function(keys, args) return ext_call(keys, args, true) end,
  flags = { 'allow-oom' } }
