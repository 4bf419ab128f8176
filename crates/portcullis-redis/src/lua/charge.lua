-- Charging after the fact (ALGORITHMS.md, "Charging after the response";
-- algorithms/charge.rs in portcullis-core is the twin): a cost known once a
-- request has run is charged whatever the state, never denied, into a
-- debt of at most one full capacity beyond empty. Needs gcra.lua and
-- token_bucket.lua (CHG.x answers with ALG.x's peek of the state it left).
--
-- charge(PLAN, KEYS, ARGV, o): PLAN holds one CHG function per key;
-- arguments and reply as check.lua's (five integers per policy: the state
-- after the charge as a peek reports it). Every policy is charged.

-- The last microsecond a charged state may reach (2^53 - 1).
local HORIZON = 2 * MAX - 1
local CHG = {}

CHG.gcra = function(key, L, P, B, now, c, tail)
  tail = tail or tail_of(L, P, B)
  local S, I = bucket_scale(L, P, B)
  local cap = B * I
  local us, rem, rescaled = pair_read(key, 'gcra', B, S, I, now, tail)
  local ahead = 0
  if us ~= nil and us >= now then
    ahead = us - now
  else
    rem = 0
  end
  local full_reset = ceil_div(cap, S)
  local repaired = rescaled
  if ahead > full_reset + tolerance(full_reset) then
    local whole = div(cap, S)
    ahead, rem, repaired = whole, cap - whole * S, true
  end
  -- ceiling = min(2 x cap, (HORIZON - now) x S), never formed past 2^53.
  local ceiling = 2 * cap
  local room = max0(HORIZON - now)
  if room < ceil_div(ceiling, S) then
    ceiling = room * S
  end
  local ca = div(ceiling, S)
  local at_ceiling = ahead > ca or (ahead == ca and rem >= ceiling - ca * S)
  local cost = c
  if cost > 2 * B then
    cost = 2 * B
  end
  local charge = cost * I
  if not at_ceiling and charge > 0 then
    -- ahead <= ca: the span is below the ceiling, exact.
    local span = ahead * S + rem
    if charge >= ceiling - span then
      span = ceiling
    else
      span = span + charge
    end
    ahead = div(span, S)
    rem = span - ahead * S
  elseif not repaired then
    return ALG.gcra(key, L, P, B, now, 0, tail)
  end
  local ok, remaining, retry, reset = pair_step(now + ahead, rem, S, I, B, now, 0)
  put(key, pair_value('gcra', now + ahead, rem) .. tail, now + reset)
  return { ok, remaining, retry, reset, 0 }
end

CHG.token_bucket = function(key, L, P, B, now, c, tail)
  tail = tail or tail_of(L, P, B)
  local S, I = bucket_scale(L, P, B)
  local full = B * I
  local level, last = full, now
  local stored_level, stored_last, rescaled = token_bucket_read(key, tail, S, I, B, now)
  if stored_level ~= nil then
    level, last = stored_level, stored_last
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
  local repaired = rescaled
  if (last - now) + ceil_div(full - level, S) > full_reset + tolerance(full_reset) then
    level, last, repaired = 0, now, true
  end
  local cost = c
  if cost > 2 * B then
    cost = 2 * B
  end
  local need = cost * I
  local new_level, new_last = level - need, last
  if level < need then
    -- Past empty: the refill of the deficit is postponed, rounded up to a
    -- whole microsecond, at most to one full reset from now.
    local limit = now + full_reset
    if last > limit then
      limit = last
    end
    local horizon = HORIZON
    if last > horizon then
      horizon = last
    end
    if limit > horizon then
      limit = horizon
    end
    local add = ceil_div(need - level, S)
    new_level, new_last = 0, limit
    if add < limit - last then
      new_last = last + add
    end
  end
  local unchanged = stored_level == new_level and stored_last == new_last
  if (need == 0 or unchanged) and not repaired then
    return ALG.token_bucket(key, L, P, B, now, 0, tail)
  end
  put(key, 'token_bucket:' .. fmt(new_level) .. ':' .. fmt(new_last) .. tail,
    new_last + ceil_div(full - new_level, S))
  return ALG.token_bucket(key, L, P, B, now, 0, tail)
end

local function charge(PLAN, KEYS, ARGV, o, NO_NEW_KEYS)
  local n = #KEYS
  if n ~= #PLAN or #ARGV ~= o + 2 + n then
    return redis.error_reply('ERR portcullis: charge called with ' .. n .. ' keys and ' .. (#ARGV - o) .. ' arguments for ' .. #PLAN .. ' policies')
  end
  local now = now_of(ARGV[o + 1])
  local cost = tonumber(ARGV[o + 2])
  if cost == nil or cost < 0 then
    return redis.error_reply('ERR portcullis: the charge is not a non-negative integer')
  end
  local policies = {}
  for i = 1, n do
    local L, P, B, tail = policy_of(ARGV[o + 2 + i])
    if L == nil then
      return redis.error_reply('ERR portcullis: policy ' .. i .. ' is not <limit>:<period_us>:<capacity>')
    end
    policies[i] = { L, P, B, tail }
  end
  if NO_NEW_KEYS and cost > 0 then
    -- The allow-oom twin (run after Redis refused the charge with OOM, at
    -- maxmemory + noeviction): held subjects are charged exactly; one
    -- whose key would have to be created is answered NOROOM, nothing
    -- written.
    for i = 1, n do
      if redis.call('EXISTS', KEYS[i]) == 0 then
        return redis.status_reply('NOROOM')
      end
    end
  end
  local reply = {}
  for i = 1, n do
    local p = policies[i]
    local d = PLAN[i](KEYS[i], p[1], p[2], p[3], now, cost, p[4])
    local b = 5 * (i - 1)
    if d[1] then
      reply[b + 1] = 1
    else
      reply[b + 1] = 0
    end
    reply[b + 2] = d[2]
    reply[b + 3] = d[3]
    reply[b + 4] = d[4]
    reply[b + 5] = d[5]
  end
  return reply
end
