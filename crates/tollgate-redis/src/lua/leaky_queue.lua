-- Leaky bucket as a queue: the GCRA arithmetic (needs gcra.lua) on the time
-- the queue is free, reporting each admitted request's delay.
-- State: the string "leaky_queue:<us>:<rem>".
ALG.leaky_queue = function(key, L, P, B, now, c)
  local us, rem = pair_parse(read_string(key), 'leaky_queue', L)
  local ok, remaining, retry, reset, delay, new_us, new_rem = pair_step(us, rem, L, P, B, now, c)
  if new_us == nil then
    return { ok, remaining, retry, reset, delay }
  end
  return { ok, remaining, retry, reset, delay, key, 'leaky_queue:' .. fmt(new_us) .. ':' .. fmt(new_rem), now + reset }
end
