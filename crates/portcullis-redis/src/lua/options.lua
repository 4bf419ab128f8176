-- The check with options (Store::check_with; memory/table/general.rs,
-- memory/records.rs and algorithms/classes.rs in portcullis-core are the
-- twins): an idempotency record and
-- priority-class reserves, in the same call as the check. Needs check.lua's
-- helpers (the prelude and the algorithms).
--
-- check_ext(PLAN, KEYS, ARGV, o, NO_NEW_KEYS):
-- KEYS[1..n]: the state keys; KEYS[n+1], when the window is not 0: the
-- record's key, <prefix>:{<subject>}:#<sha256 hex> (same hash slot).
-- ARGV[o+1]: now in microseconds or '' for TIME. ARGV[o+2]: the cost.
-- ARGV[o+3]: the record's window in microseconds (0: no record).
-- ARGV[o+4]: the record's free replays.
-- ARGV[o+4+i]: policy i, "<limit>:<period_us>:<capacity>".
-- ARGV[o+4+n+i]: policy i's reserve in permits (0: none).
-- Reply: check.lua's five integers per policy; or, for a live record with
-- a free replay left, the bulk string it holds: those integers of the
-- first check, comma-separated.
--
-- A record is "<expires_us>:<replays left>:<i1>,<i2>,...", written with
-- PXAT its expiry, and only for an admitted check (a denial is never
-- replayed). It answers while now is before its expiry (so the
-- client-clock mode ages it like the state) and replays are left, each
-- replay rewriting it one fewer; Redis drops it at its expiry. A value in
-- another form (such as an older version's) counts as absent. With no
-- room for a new key (the allow-oom twin), the check goes on without a
-- record: its retry is charged again, never more admitted.
--
-- A class with reserve r admits cost c when c + r would be admitted, and
-- charges c; denied, it answers the decision of c + r (its retry_after is
-- when the class may go); remaining is what the class may still spend. A
-- peek of a class probes 1 + r.
local function class_step(alg, key, L, P, B, now, c, r, tail)
  if r == 0 then
    return alg(key, L, P, B, now, c, tail)
  end
  local probe_cost = c
  if c == 0 then
    probe_cost = 1
  end
  local d = alg(key, L, P, B, now, probe_cost + r, tail)
  if d[1] then
    d = alg(key, L, P, B, now, c, tail)
  end
  local remaining = d[2] - r
  if remaining < 0 then
    remaining = 0
  end
  d[2] = remaining
  return d
end

local function check_ext(PLAN, KEYS, ARGV, o, NO_NEW_KEYS)
  local n = #PLAN
  local window = tonumber(ARGV[o + 3])
  if window == nil or window < 0 then
    return redis.error_reply('ERR portcullis: the idempotency window is not a non-negative integer')
  end
  local keys = n
  if window > 0 then
    keys = n + 1
  end
  if #KEYS ~= keys or #ARGV ~= o + 4 + 2 * n then
    return redis.error_reply('ERR portcullis: check_ext called with ' .. #KEYS .. ' keys and ' .. (#ARGV - o) .. ' arguments for ' .. n .. ' policies')
  end
  local now = now_of(ARGV[o + 1])
  local cost = tonumber(ARGV[o + 2])
  local replays = tonumber(ARGV[o + 4])
  if replays == nil or replays < 0 then
    return redis.error_reply('ERR portcullis: the free replays are not a non-negative integer')
  end
  local record = KEYS[n + 1]
  if window > 0 then
    local stored = redis.call('GET', record)
    if stored then
      local expires, left, body = string.match(stored, '^(%d+):(%d+):([%d,%-]+)$')
      local at, rest = nil, nil
      if expires ~= nil then
        at, rest = num(expires), num(left)
      end
      if at ~= nil and rest ~= nil and at > now and rest > 0 then
        redis.call('SET', record, expires .. ':' .. fmt(rest - 1) .. ':' .. body,
          'PXAT', fmt(ceil_div(at, 1000)))
        return body
      end
    end
  end
  local decisions = {}
  local all = true
  for i = 1, n do
    local L, P, B, tail = policy_of(ARGV[o + 4 + i])
    local r = tonumber(ARGV[o + 4 + n + i])
    if L == nil or r == nil then
      return redis.error_reply('ERR portcullis: policy ' .. i .. ' is not <limit>:<period_us>:<capacity> with a reserve')
    end
    local d = class_step(PLAN[i], KEYS[i], L, P, B, now, cost, r, tail)
    decisions[i] = d
    if not d[1] then
      all = false
    end
  end
  if not all and cost > 0 then
    for i = 1, n do
      if decisions[i][1] then
        local L, P, B, tail = policy_of(ARGV[o + 4 + i])
        decisions[i] = class_step(PLAN[i], KEYS[i], L, P, B, now, 0, tonumber(ARGV[o + 4 + n + i]))
      end
    end
  end
  local keep = window > 0 and all and replays > 0
  if NO_NEW_KEYS then
    -- The allow-oom twin: a state key to create is refused; a record to
    -- create is left out (a record only spares a retry its charge).
    if keep and redis.call('EXISTS', record) == 0 then
      keep = false
    end
    if all and cost > 0 then
      for i = 1, n do
        local d = decisions[i]
        if (d[9] ~= nil or d[6] ~= nil) and redis.call('EXISTS', KEYS[i]) == 0 then
          return redis.status_reply('NOROOM')
        end
      end
    end
  end
  if all and cost > 0 then
    write_all(decisions, n)
  end
  local reply = reply_of(decisions, n)
  if keep then
    local parts = {}
    for j = 1, #reply do
      parts[j] = fmt(reply[j])
    end
    local expires = now + window
    redis.call('SET', record, fmt(expires) .. ':' .. fmt(replays) .. ':' .. table.concat(parts, ','),
      'PXAT', fmt(ceil_div(expires, 1000)))
  end
  return reply
end
