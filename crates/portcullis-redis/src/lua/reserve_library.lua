-- Token reservations' registration in the portcullis Redis Functions
-- library (after reserve.lua; library.rs adds FN_RESERVE and
-- FN_RESERVE_OOM). Keys and arguments as reserve.lua's reservation.
redis.register_function{ function_name = FN_RESERVE,
  callback = function(keys, args) return reservation(keys, args, false) end }
-- The allow-oom twin: settles and renewals run at maxmemory, and a
-- reserve answers NOROOM.
redis.register_function{ function_name = FN_RESERVE_OOM,
  callback = function(keys, args) return reservation(keys, args, true) end,
  flags = { 'allow-oom' } }
