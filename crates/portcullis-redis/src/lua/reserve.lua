-- Token reservations (portcullis-core's reserve module and
-- algorithms::refund; ALGORITHMS.md, "Reservations"): a reserve charges
-- the estimate to the token policies and 1 to the request policies, and
-- takes a place in flight, all or nothing; a settle refunds the unused
-- part or charges the overage up to a cap, once. Needs every algorithm,
-- check.lua (write_all, reply_of) and charge.lua (CHG).
--
-- reservation(KEYS, ARGV):
-- KEYS[1]: the reservation's record, KEYS[2]: the budget's open set,
-- KEYS[2 + i]: the state of policy i (a settle and a renew pass the token
-- policies only). All in the subject's hash slot.
-- ARGV[1]: 'r' reserve, 's' settle, 'n' renew. ARGV[2]: one letter per policy
-- (plan.lua's CODES). ARGV[3]: now in microseconds, or '' for TIME.
-- ARGV[4]: the token policies' count. ARGV[5]: the estimate (reserve) or
-- the usage (settle). ARGV[6]: max in flight, 0 for none (reserve) or
-- the overage cap (settle). ARGV[7]: the TTL in microseconds.
-- ARGV[8]: the reservation id. ARGV[8 + i]: policy i.
--
-- The record is "o:<estimate>:<expires_us>" while open and
-- "s:<estimate>:<used>:<overage>:<expires_us>" once settled; the open
-- set holds the open ids scored by their expiry, only when a maximum in
-- flight is given. Both are read against `now`, never against the key's
-- own expiry (which also ends them, rounded up to the millisecond).
--
-- reservation(KEYS, ARGV, no_new_keys): no_new_keys in the allow-oom twin
-- (Redis at maxmemory), where a reserve answers NOROOM.
--
-- Reply of a reserve: { status, in_flight, retry_after_us (-1: none),
-- then five integers per policy as check.lua's }, status 1 admitted,
-- 2 replayed, 0 refused by a policy, 3 refused in flight. Of a settle:
-- { status, estimate, used, overage, then five integers per token
-- policy }, status 1 settled, 2 replayed, 0 unknown.

-- Refunds: the state as if `amount` fewer permits had been charged,
-- never past full; then its peek.
local REF = {}

REF.gcra = function(key, L, P, B, now, amount, tail)
  local S, I = bucket_scale(L, P, B)
  local cap = B * I
  local us, rem = pair_read(key, 'gcra', B, S, I, now, tail)
  if us == nil or amount == 0 or us < now or (us == now and rem == 0) then
    return ALG.gcra(key, L, P, B, now, 0, tail)
  end
  local ahead = us - now
  local full_reset = ceil_div(cap, S)
  if ahead > full_reset + tolerance(full_reset) then
    local whole = div(cap, S)
    ahead, rem = whole, cap - whole * S
  end
  local cost = amount
  if cost > 2 * B then
    cost = 2 * B
  end
  -- (ahead, rem) - give, as whole microseconds and a fraction: never
  -- formed past 2^53.
  local give = cost * I
  local give_us = div(give, S)
  ahead, rem = ahead - give_us, rem - (give - give_us * S)
  if rem < 0 then
    ahead, rem = ahead - 1, rem + S
  end
  if ahead < 0 or (ahead == 0 and rem == 0) then
    redis.call('DEL', key)
  else
    local expires = now + ahead
    if rem > 0 then
      expires = expires + 1
    end
    put(key, pair_value('gcra', now + ahead, rem) .. tail, expires)
  end
  return ALG.gcra(key, L, P, B, now, 0, tail)
end

REF.token_bucket = function(key, L, P, B, now, amount, tail)
  local S, I = bucket_scale(L, P, B)
  local full = B * I
  local level, last = token_bucket_read(key, tail, S, I, B, now)
  if level == nil or amount == 0 then
    return ALG.token_bucket(key, L, P, B, now, 0, tail)
  end
  if level > full then
    level = full
  end
  if now > last then
    if now - last >= ceil_div(full - level, S) then
      level = full
    else
      level = level + (now - last) * S
    end
    last = now
  end
  local full_reset = ceil_div(full, S)
  if (last - now) + ceil_div(full - level, S) > full_reset + tolerance(full_reset) then
    level, last = 0, now
  end
  if level == full and last == now then
    return ALG.token_bucket(key, L, P, B, now, 0, tail)
  end
  local cost = amount
  if cost > 2 * B then
    cost = 2 * B
  end
  local give = cost * I
  local lag = last - now
  if lag >= ceil_div(give, S) then
    -- Within the postponed refill: under a microsecond is not given back.
    last = last - div(give, S)
  else
    -- lag x S < give <= 2^53: exact.
    local add = give - lag * S
    if add >= full - level then
      level = full
    else
      level = level + add
    end
    last = now
  end
  put(key, 'token_bucket:' .. fmt(level) .. ':' .. fmt(last) .. tail,
    last + ceil_div(full - level, S))
  return ALG.token_bucket(key, L, P, B, now, 0, tail)
end

local RESERVE_CODES = { a = ALG.gcra, b = ALG.leaky_queue, c = ALG.token_bucket,
  d = ALG.leaky_meter, e = ALG.fixed_window, f = ALG.sliding_window,
  g = ALG.sliding_log }
local REFUND_CODES = { a = REF.gcra, c = REF.token_bucket }
local OVERAGE_CODES = { a = CHG.gcra, c = CHG.token_bucket }

-- The record of a reservation live at now: 'o' or 's', then its numbers;
-- nil when absent, expired or unreadable.
local function record_of(key, now)
  local value = read_string(key)
  if value == nil then
    return nil
  end
  local e, x = string.match(value, '^o:(%d+):(%d+)$')
  if e ~= nil then
    local estimate, expires = num(e), num(x)
    if estimate == nil or expires == nil or expires <= now then
      return nil
    end
    return 'o', estimate
  end
  local u, o
  e, u, o, x = string.match(value, '^s:(%d+):(%d+):(%d+):(%d+)$')
  if e == nil then
    return nil
  end
  local estimate, used, overage, expires = num(e), num(u), num(o), num(x)
  if estimate == nil or used == nil or overage == nil or expires == nil or expires <= now then
    return nil
  end
  return 's', estimate, used, overage
end

-- Sets the open set's expiry to its latest reservation's (it is not
-- empty), rounded up to the millisecond.
local function open_expire(set)
  local top = redis.call('ZREVRANGE', set, 0, 0, 'WITHSCORES')
  redis.call('PEXPIREAT', set, fmt(ceil_div(tonumber(top[2]), 1000)))
end

-- Open reservations live at now, and the earliest expiry among them.
-- Reads only: the expired are dropped once a reservation is written (a
-- script's first write decides whether Redis at maxmemory refuses it, and
-- only a write that may grow memory, as SET, is refused; one that shrinks
-- it first would let the rest through).
local function open_count(set, now)
  local live = '(' .. fmt(now)
  local n = redis.call('ZCOUNT', set, live, '+inf')
  if n == 0 then
    return 0, nil
  end
  local first = redis.call('ZRANGEBYSCORE', set, live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return n, tonumber(first[2])
end

local function reserve(KEYS, ARGV, now, policies, count, code)
  local tokens, estimate, max, ttl, id = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
  local n = #policies
  local function peeks()
    local decisions = {}
    for i = 1, n do
      local p = policies[i]
      decisions[i] = RESERVE_CODES[string.sub(code, i, i)](KEYS[2 + i], p[1], p[2], p[3], now, 0, p[4])
    end
    return decisions
  end
  local open, first = 0, nil
  if max > 0 then
    open, first = open_count(KEYS[2], now)
  end
  local function answer(status, retry, decisions)
    local reply = reply_of(decisions, n)
    table.insert(reply, 1, retry)
    table.insert(reply, 1, open)
    table.insert(reply, 1, status)
    return reply
  end
  if record_of(KEYS[1], now) ~= nil then
    return answer(2, -1, peeks())
  end
  if max > 0 and open >= max then
    return answer(3, first - now, peeks())
  end
  local decisions = {}
  local all = true
  for i = 1, n do
    local p = policies[i]
    local cost = 1
    if i <= tokens then
      cost = estimate
    end
    local d = RESERVE_CODES[string.sub(code, i, i)](KEYS[2 + i], p[1], p[2], p[3], now, cost, p[4])
    decisions[i] = d
    if not d[1] then
      all = false
    end
  end
  if not all then
    for i = 1, n do
      if decisions[i][1] then
        local p = policies[i]
        decisions[i] = RESERVE_CODES[string.sub(code, i, i)](KEYS[2 + i], p[1], p[2], p[3], now, 0, p[4])
      end
    end
    return answer(0, -1, decisions)
  end
  write_all(decisions, n)
  local expires = now + ttl
  put(KEYS[1], 'o:' .. fmt(estimate) .. ':' .. fmt(expires), expires)
  if max > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', fmt(now))
    redis.call('ZADD', KEYS[2], fmt(expires), id)
    open = open + 1
    open_expire(KEYS[2])
  end
  return answer(1, -1, decisions)
end

local function settle(KEYS, ARGV, now, policies, code)
  local used, cap, ttl, id = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
  local n = #policies
  local function answer(status, estimate, u, overage, decisions)
    local reply = reply_of(decisions, n)
    table.insert(reply, 1, overage)
    table.insert(reply, 1, u)
    table.insert(reply, 1, estimate)
    table.insert(reply, 1, status)
    return reply
  end
  local function peeks()
    local decisions = {}
    for i = 1, n do
      local p = policies[i]
      decisions[i] = RESERVE_CODES[string.sub(code, i, i)](KEYS[2 + i], p[1], p[2], p[3], now, 0, p[4])
    end
    return decisions
  end
  local kind, estimate, u0, o0 = record_of(KEYS[1], now)
  if kind == nil then
    return answer(0, 0, used, 0, peeks())
  end
  if kind == 's' then
    return answer(2, estimate, u0, o0, peeks())
  end
  local overage = 0
  if used > estimate then
    overage = used - estimate
    if overage > cap then
      overage = cap
    end
  end
  local decisions = {}
  for i = 1, n do
    local p = policies[i]
    local letter = string.sub(code, i, i)
    local step
    if used < estimate then
      step = REFUND_CODES[letter]
      decisions[i] = step(KEYS[2 + i], p[1], p[2], p[3], now, estimate - used, p[4])
    else
      step = OVERAGE_CODES[letter]
      decisions[i] = step(KEYS[2 + i], p[1], p[2], p[3], now, overage, p[4])
    end
  end
  local expires = now + ttl
  put(KEYS[1], 's:' .. fmt(estimate) .. ':' .. fmt(used) .. ':' .. fmt(overage) .. ':' .. fmt(expires), expires)
  redis.call('ZREM', KEYS[2], id)
  return answer(1, estimate, used, overage, decisions)
end

-- Keeps an open reservation for the TTL from now, its place in flight
-- with it; charges nothing. Reply: { status, then five integers per token
-- policy (peeks) }, status 1 kept, 0 not open (settled, expired, never
-- made).
local function renew(KEYS, ARGV, now, policies, code)
  local ttl, id = tonumber(ARGV[7]), ARGV[8]
  local n = #policies
  local decisions = {}
  for i = 1, n do
    local p = policies[i]
    decisions[i] = RESERVE_CODES[string.sub(code, i, i)](KEYS[2 + i], p[1], p[2], p[3], now, 0, p[4])
  end
  local status = 0
  local kind, estimate = record_of(KEYS[1], now)
  if kind == 'o' then
    local expires = now + ttl
    put(KEYS[1], 'o:' .. fmt(estimate) .. ':' .. fmt(expires), expires)
    if redis.call('ZSCORE', KEYS[2], id) then
      redis.call('ZADD', KEYS[2], fmt(expires), id)
      open_expire(KEYS[2])
    end
    status = 1
  end
  local reply = reply_of(decisions, n)
  table.insert(reply, 1, status)
  return reply
end

local function reservation(KEYS, ARGV, no_new_keys)
  if #ARGV < 9 or #KEYS ~= #ARGV - 6 then
    return redis.error_reply('ERR portcullis: reservation called with ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments; upgrade portcullis-redis')
  end
  local op, code = ARGV[1], ARGV[2]
  local now = now_of(ARGV[3])
  local count = #ARGV - 8
  if now == nil or type(code) ~= 'string' or #code ~= count then
    return redis.error_reply('ERR portcullis: reservation arguments do not parse; upgrade portcullis-redis')
  end
  for i = 4, 7 do
    if tonumber(ARGV[i]) == nil or tonumber(ARGV[i]) < 0 then
      return redis.error_reply('ERR portcullis: reservation argument ' .. i .. ' is not a non-negative integer')
    end
  end
  local tokens = tonumber(ARGV[4])
  local policies = {}
  for i = 1, count do
    local L, P, B, tail = policy_of(ARGV[8 + i])
    local letter = string.sub(code, i, i)
    if L == nil or RESERVE_CODES[letter] == nil then
      return redis.error_reply('ERR portcullis: reservation policy ' .. i .. ' does not parse; upgrade portcullis-redis')
    end
    if i <= tokens and REFUND_CODES[letter] == nil then
      return redis.error_reply('ERR portcullis: a token policy must use GCRA or the token bucket')
    end
    policies[i] = { L, P, B, tail }
  end
  if op == 'r' then
    if no_new_keys then
      -- At maxmemory: a reservation writes a new record, so none is made
      -- (settles and renewals, which write what is there, still run).
      return redis.status_reply('NOROOM')
    end
    return reserve(KEYS, ARGV, now, policies, count, code)
  end
  if op == 's' and tokens == count then
    return settle(KEYS, ARGV, now, policies, code)
  end
  if op == 'n' and tokens == count then
    return renew(KEYS, ARGV, now, policies, code)
  end
  return redis.error_reply('ERR portcullis: unknown reservation operation; upgrade portcullis-redis')
end
