-- Leaky bucket as a queue: the GCRA arithmetic (needs gcra.lua) on the time
-- the queue is free, reporting each admitted request's delay.
-- State: the string "leaky_queue:<us>:<rem>".
ALG.leaky_queue = function(key, L, P, B, now, c, tail)
  return pair_alg('leaky_queue', key, L, P, B, now, c, true, tail)
end
