-- Coalesced checks of one policy of the other algorithms' fast paths
-- (coalesce/; ALGORITHMS.md, "Coalesced checks"): gcra_batch's shape
-- (batch.lua) for the fixed window, the sliding window, the sliding log,
-- the token bucket and both leaky buckets. Each reads the state once as
-- its fast function reads it (*_fast.lua, bucket_fast.lua), decides the
-- checks in turn, each on what the admissions before it left, exactly as
-- that fast function called once per check at the same now would, and
-- writes once when any admitted: the state the last admission would have
-- left. (Library only: after batch.lua and the fast functions.)
--
-- ARGV[1] = "<limit>:<period_us>:<capacity>", ARGV[2] = now or '' (TIME),
-- ARGV[3..] = the costs, each one the fast function takes (from 1 to the
-- capacity; to the limit for the windows and the log). Reply: one reply
-- per check, what the fast function answers alone (one integer; a sliding
-- log's denial, the general check's five); or the status GENERAL, having
-- written nothing, for a state the fast function hands to the general
-- check (the client then sends the general batch); or, from the allow-oom
-- twin, NOROOM for a new key (whose first check admits, so every check of
-- the batch would be refused), as gcra_batch answers.

-- memo() of a batch's policy argument "<limit>:<period_us>:<capacity>":
-- build(L, P, B, policy) returns what the function keeps, or nil.
local function memo_batch(build)
  return memo(function(arg)
    local a, b, c = string.match(arg, '^(%d+):(%d+):(%d+)$')
    if a == nil then
      return nil
    end
    return build(tonumber(a), tonumber(b), tonumber(c), arg)
  end)
end
local function bad_argument(what)
  return redis.error_reply('ERR portcullis: batch ' .. what .. ' argument is not <limit>:<period_us>:<capacity>; upgrade portcullis-redis')
end
local function bad_cost(what)
  return redis.error_reply('ERR portcullis: batch ' .. what .. ' cost is not one its fast function takes')
end
-- Cost j (from ARGV[3]), or nil unless a whole number from 1 to most.
local function cost_of(args, j, most)
  local c = tonumber(args[j])
  if c == nil or c < 1 or c > most or c % 1 ~= 0 then
    return nil
  end
  return c
end

-- The fixed window (fixed_window_fast.lua): the count of now's window,
-- each reply count x period + elapsed before the check (-1 - that when
-- denied), one SET of the last count.
local fw_batch_of = memo_batch(function(L, P)
  if L < 1 or P < 1 or L * P > MAX then
    return nil
  end
  return { L, P }
end)
local function fixed_window_batch(keys, args, no_new_keys)
  local f = fw_batch_of(args[1])
  if f == nil then
    return bad_argument('fixed window')
  end
  local L, P = f[1], f[2]
  local now = now_of(args[2])
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
      return redis.status_reply('GENERAL')
    end
    if s_ws == ws then
      count = s_count
    end
  elseif no_new_keys then
    return redis.status_reply('NOROOM')
  end
  local e = now - ws
  local replies, admitted = {}, false
  for j = 3, #args do
    local c = cost_of(args, j, L)
    if c == nil then
      return bad_cost('fixed window')
    end
    local reply = count * P + e
    if count + c <= L then
      replies[j - 2] = reply
      count = count + c
      admitted = true
    else
      replies[j - 2] = -1 - reply
    end
  end
  if admitted then
    put(keys[1], 'fixed_window:' .. fmt(ws) .. ':' .. fmt(count), ws + P)
  end
  return replies
end

-- The sliding window counter (sliding_window_fast.lua): the two counts
-- weighed, each reply (previous x (limit + 1) + current) x period +
-- elapsed before the check (-1 - that when denied), one SET of the last
-- counts.
local sw_batch_of = memo_batch(function(L, P)
  if L < 1 or P < 1 or (L + 1) * (L + 1) * P > MAX then
    return nil
  end
  return { L, P }
end)
local function sliding_window_batch(keys, args, no_new_keys)
  local f = sw_batch_of(args[1])
  if f == nil then
    return bad_argument('sliding window')
  end
  local L, P = f[1], f[2]
  local now = now_of(args[2])
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
      return redis.status_reply('GENERAL')
    end
    if s_ws == ws then
      if s_prev > L or s_curr > L then
        return redis.status_reply('GENERAL')
      end
      prev, curr = s_prev, s_curr
    elseif s_ws + P == ws then
      if s_curr > L then
        return redis.status_reply('GENERAL')
      end
      prev = s_curr
    end
    -- An older window: both counts 0.
  elseif no_new_keys then
    return redis.status_reply('NOROOM')
  end
  local e = now - ws
  local weighted = prev * (P - e)
  local replies, admitted = {}, false
  for j = 3, #args do
    local c = cost_of(args, j, L)
    if c == nil then
      return bad_cost('sliding window')
    end
    local reply = (prev * (L + 1) + curr) * P + e
    if curr + c <= L and weighted <= (L - curr - c) * P then
      replies[j - 2] = reply
      curr = curr + c
      admitted = true
    else
      replies[j - 2] = -1 - reply
    end
  end
  if admitted then
    put(keys[1], string.format('sliding_window:%d:%d:%d', ws, prev, curr), ws + 2 * P)
  end
  return replies
end

-- The token bucket, or with meter = true the leaky bucket meter
-- (bucket_fast.lua): the level after the refill (the drain) up to now,
-- each reply the level before the check (-1 - level when denied), one SET
-- of the last level at now.
local bucket_batch_of = memo_batch(function(L, P, B, policy)
  if L < 1 or P < 1 or B < 1 then
    return nil
  end
  local S, I = bucket_scale(L, P, B)
  return { S, I, B * I, B, '@' .. policy }
end)
local function bucket_batch(keys, args, no_new_keys, meter)
  local f = bucket_batch_of(args[1])
  if f == nil then
    return bad_argument('bucket')
  end
  local S, I, full, B = f[1], f[2], f[3], f[4]
  local form = '^token_bucket:(%d+):(%d+)$'
  local level = full
  if meter then
    form = '^leaky_meter:(%d+):(%d+)$'
    level = 0
  end
  local now = now_of(args[2])
  local value = redis.pcall('GET', keys[1])
  if value then
    local l, t
    value = own_state(value, f[5])
    if value ~= nil then
      local a, b = string.match(value, form)
      if a ~= nil then
        l, t = num(a), num(b)
      end
    end
    if l == nil or t == nil or l > full or t > now then
      return redis.status_reply('GENERAL')
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
    return redis.status_reply('NOROOM')
  end
  local replies, admitted = {}, false
  for j = 3, #args do
    local c = cost_of(args, j, B)
    if c == nil then
      return bad_cost('bucket')
    end
    local need = c * I
    if meter then
      if level + need <= full then
        replies[j - 2] = level
        level = level + need
        admitted = true
      else
        replies[j - 2] = -1 - level
      end
    elseif level >= need then
      replies[j - 2] = level
      level = level - need
      admitted = true
    else
      replies[j - 2] = -1 - level
    end
  end
  if admitted then
    if meter then
      put(keys[1], 'leaky_meter:' .. fmt(level) .. ':' .. fmt(now) .. f[5], now + ceil_div(level, S))
    else
      put(keys[1], 'token_bucket:' .. fmt(level) .. ':' .. fmt(now) .. f[5], now + ceil_div(full - level, S))
    end
  end
  return replies
end

-- The leaky bucket queue (leaky_queue_fast.lua; gcra_batch's policies,
-- batch_policy_of): the time until the queue is free, each reply that
-- before the check (the admitted check's delay; -1 - that when denied),
-- one SET of the last.
local function leaky_queue_batch(keys, args, no_new_keys)
  local f = batch_policy_of(args[1])
  if f == nil then
    return bad_argument('leaky queue')
  end
  local now = now_of(args[2])
  local ahead = 0
  local value = redis.pcall('GET', keys[1])
  if value then
    local free
    value = own_state(value, f[5])
    if value ~= nil then
      local a = string.match(value, '^leaky_queue:(%d+):0$')
      if a ~= nil then
        free = num(a)
      end
    end
    if free == nil or free - now > f[3] then
      return redis.status_reply('GENERAL')
    end
    if free > now then
      ahead = free - now
    end
  elseif no_new_keys then
    return redis.status_reply('NOROOM')
  end
  local replies, admitted = {}, false
  for j = 3, #args do
    local c = cost_of(args, j, f[4])
    if c == nil then
      return bad_cost('leaky queue')
    end
    local span = ahead + c * f[1]
    if span > f[2] then
      replies[j - 2] = -1 - ahead
    else
      replies[j - 2] = ahead
      ahead = span
      admitted = true
    end
  end
  if admitted then
    put(keys[1], string.format('leaky_queue:%d:0', now + ahead) .. f[5], now + ahead)
  end
  return replies
end

-- The sliding log (sliding_log_fast.lua): the live entries counted once
-- (ZCARD less the expired), the newest read once; an admission answers
-- the live entries before it; a denial the general check's five integers,
-- its k-th entry the (L - c)th from the newest (rank 0) of the log as the
-- admissions before it left it: one of theirs (at now) when that rank is
-- below their count, else a stored entry, read by rank (once per rank).
-- At the end, the expired entries removed and the admitted ones added at
-- now, numbered after the entries at now (none, unless the newest is at
-- now), as the admissions one by one would have added them: the first
-- by the fast function (numbered from 1), or by the general check when
-- there were entries at now already, and the later ones by the general
-- check, which numbers after those at now; each admission's reply is the
-- fast function's one integer, the same decision as the general check's
-- five. A log the general check alone reads (more live entries than the
-- limit, an entry after now, another type) answers GENERAL.
local log_batch_of = memo_batch(function(L, P)
  if L < 1 or P < 1 then
    return nil
  end
  return { L, P }
end)
local function sliding_log_batch(keys, args, no_new_keys)
  local f = log_batch_of(args[1])
  if f == nil then
    return bad_argument('sliding log')
  end
  local L, P = f[1], f[2]
  local now = now_of(args[2])
  local key = keys[1]
  local cutoff = fmt(now - P) -- entries scored <= cutoff have left the window
  local card = redis.pcall('ZCARD', key)
  if type(card) ~= 'number' then
    return redis.status_reply('GENERAL')
  end
  if card == 0 and no_new_keys then
    return redis.status_reply('NOROOM')
  end
  local live, dead, newest = 0, 0, nil
  if card > 0 then
    dead = redis.call('ZCOUNT', key, '-inf', cutoff)
    live = card - dead
  end
  if live > L then
    return redis.status_reply('GENERAL')
  end
  if live > 0 then
    local top = redis.call('ZREVRANGE', key, '0', '0', 'WITHSCORES')
    newest = tonumber(top[2])
    if newest == nil or newest > now then
      return redis.status_reply('GENERAL')
    end
  end
  local added = 0
  local by_rank = {}
  local replies = {}
  for j = 3, #args do
    local c = cost_of(args, j, L)
    if c == nil then
      return bad_cost('sliding log')
    end
    if live + c <= L then
      replies[j - 2] = live
      live = live + c
      added = added + c
    else
      local rank = L - c
      local t = now
      if rank >= added then
        local r = rank - added
        t = by_rank[r]
        if t == nil then
          local kth = redis.call('ZREVRANGE', key, fmt(r), fmt(r), 'WITHSCORES')
          t = tonumber(kth[2])
          if t == nil then
            return redis.status_reply('GENERAL')
          end
          by_rank[r] = t
        end
      end
      local last = newest
      if added > 0 then
        last = now
      end
      replies[j - 2] = { 0, L - live, t + P - now, last + P - now, 0 }
    end
  end
  if added > 0 then
    if dead > 0 then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    end
    local score = fmt(now)
    -- Numbered after the entries at now, when there are some.
    local first = 1
    if newest == now then
      first = redis.call('ZCOUNT', key, score, score) + 1
    end
    log_add(key, now, score, first, added, P)
  end
  return replies
end

redis.register_function{ function_name = FN_FW_BATCH,
  callback = function(keys, args) return fixed_window_batch(keys, args, false) end }
redis.register_function{ function_name = FN_FW_BATCH_OOM,
  callback = function(keys, args) return fixed_window_batch(keys, args, true) end,
  flags = { 'allow-oom' } }
redis.register_function{ function_name = FN_SW_BATCH,
  callback = function(keys, args) return sliding_window_batch(keys, args, false) end }
redis.register_function{ function_name = FN_SW_BATCH_OOM,
  callback = function(keys, args) return sliding_window_batch(keys, args, true) end,
  flags = { 'allow-oom' } }
redis.register_function{ function_name = FN_TB_BATCH,
  callback = function(keys, args) return bucket_batch(keys, args, false, false) end }
redis.register_function{ function_name = FN_TB_BATCH_OOM,
  callback = function(keys, args) return bucket_batch(keys, args, true, false) end,
  flags = { 'allow-oom' } }
redis.register_function{ function_name = FN_METER_BATCH,
  callback = function(keys, args) return bucket_batch(keys, args, false, true) end }
redis.register_function{ function_name = FN_METER_BATCH_OOM,
  callback = function(keys, args) return bucket_batch(keys, args, true, true) end,
  flags = { 'allow-oom' } }
redis.register_function{ function_name = FN_QUEUE_BATCH,
  callback = function(keys, args) return leaky_queue_batch(keys, args, false) end }
redis.register_function{ function_name = FN_QUEUE_BATCH_OOM,
  callback = function(keys, args) return leaky_queue_batch(keys, args, true) end,
  flags = { 'allow-oom' } }
redis.register_function{ function_name = FN_LOG_BATCH,
  callback = function(keys, args) return sliding_log_batch(keys, args, false) end }
redis.register_function{ function_name = FN_LOG_BATCH_OOM,
  callback = function(keys, args) return sliding_log_batch(keys, args, true) end,
  flags = { 'allow-oom' } }
