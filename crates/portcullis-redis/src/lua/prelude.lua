-- portcullis: shared helpers for every script (see ALGORITHMS.md in portcullis-core).
--
-- All numbers are non-negative integers at most 2^53, exact in Lua's
-- doubles (ALGORITHMS.md, "Magnitudes"). A stored value that does not parse,
-- or holds a number past 2^53, is no state.
-- Numbers are formatted with fmt() ('%d') before they reach a string or
-- redis.call: Lua's `..` prints 14 significant digits and would round a
-- microsecond timestamp. Redis 7 converts a number passed to redis.call on
-- its own with %.17g, which is exact below 2^53 (tests/tests/
-- redis_functions.rs) but costs about 1,500 server instructions a number
-- more than '%d' (measured with callgrind).
-- floor(x) without math.floor: a Redis Functions library runs its top
-- level with no globals but `redis`, so nothing may be looked up there.
-- x - x % 1 is exact for every double (Lua's % is x - floor(x)).
local function floor(x)
  return x - x % 1
end

-- a div b, for 0 <= a <= 2^53 and b >= 1 (floor inlined: a Lua call
-- costs more than the arithmetic).
local function div(a, b)
  local q = a / b
  return q - q % 1
end

-- ceil(a / b), for 0 <= a <= 2^53 and b >= 1 (never forms a + b - 1, which
-- could pass 2^53).
local function ceil_div(a, b)
  local q = a / b
  q = q - q % 1
  if q * b < a then
    q = q + 1
  end
  return q
end

local function max0(a)
  if a < 0 then
    return 0
  end
  return a
end

local function fmt(x)
  return string.format('%d', x)
end

-- 2^52: the largest product the arithmetic forms (MAX_MAGNITUDE in Rust).
local MAX = 4503599627370496

-- A stored decimal number, or nil when it has more than 16 digits or
-- reaches 2^53 (it may not be exact: the value is then no state).
local function num(digits)
  if #digits > 16 then
    return nil
  end
  local n = tonumber(digits)
  if n == nil or n >= 2 * MAX then
    return nil
  end
  return n
end

-- How far (us) a state may lie beyond the policy's worst case, whose reset
-- is full_reset us, before it is clamped: as much again, at least a second
-- (clock_tolerance in Rust; ALGORITHMS.md, "Changing a policy").
local function tolerance(full_reset)
  if full_reset < 1000000 then
    return 1000000
  end
  return full_reset
end

-- Now in microseconds since the epoch: Redis' TIME when the client sent ''
-- (the default: every instance sees one clock), else the client's clock
-- (ClockMode::Client, for tests).
local function now_of(arg)
  if arg == '' then
    local time = redis.call('TIME')
    return tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  return tonumber(arg)
end

-- Writes a string state that expires at expires_us (microseconds): one
-- call (SET ... PXAT, Redis 6.2 and later).
local function put(key, value, expires_us)
  redis.call('SET', key, value, 'PXAT', fmt(ceil_div(expires_us, 1000)))
end

-- A policy argument "<limit>:<period_us>:<capacity>" as three numbers, or
-- nil when it does not parse. A library keeps what it parsed (a few
-- policies per deployment; forgotten past 4096), so a Functions call
-- parses each policy once; a script parses it per call.
local POLICIES = {}
local policy_count = 0
local function policy_of(arg)
  local p = POLICIES[arg]
  if p ~= nil then
    return p[1], p[2], p[3], p[4]
  end
  local a, b, c = string.match(arg, '^(%d+):(%d+):(%d+)$')
  if a == nil then
    return nil
  end
  local L, P, B = tonumber(a), tonumber(b), tonumber(c)
  if policy_count >= 4096 then
    POLICIES, policy_count = {}, 0
  end
  -- The fourth value: the shape tail the bucket states of this policy end
  -- in (shape_of below).
  local tail = '@' .. arg
  POLICIES[arg] = { L, P, B, tail }
  policy_count = policy_count + 1
  return L, P, B, tail
end

-- Shapes (ALGORITHMS.md, "Changing a policy"; algorithms::rescale in
-- Rust). A bucket state (GCRA, token bucket, leaky meter and queue) ends in
-- its shape: '@<limit>:<period_us>:<capacity>', the policy that wrote it,
-- because its numbers are counted in that policy's units. Read through a
-- policy with other numbers under the same name (a plan change), the
-- permits it holds are carried into the new units; a state without a
-- shape (written by an earlier version) is read in the current units.

-- The tail of a policy's states, for callers that hold only its numbers.
local function tail_of(L, P, B)
  return '@' .. fmt(L) .. ':' .. fmt(P) .. ':' .. fmt(B)
end

-- value without its shape, then the writing policy's L, P, B when its tail
-- is not `tail` (nothing more when it is, or when the value has none);
-- nil when the shape does not parse (no state).
local function unshape(value, tail)
  local at = string.find(value, '@', 1, true)
  if at == nil then
    return value
  end
  local n = #value - #tail
  if n + 1 == at and string.find(value, tail, at, true) == at then
    return string.sub(value, 1, n)
  end
  local L0, P0, B0 = policy_of(string.sub(value, at + 1))
  if L0 == nil or L0 < 1 or P0 < 1 or B0 < 1 or L0 > MAX or P0 > MAX or B0 > MAX then
    return nil
  end
  return string.sub(value, 1, at - 1), L0, P0, B0
end

-- ceil(a x n / d) exactly, for 0 <= a < d <= 2^52 and 0 <= n < 2^53, by
-- long multiplication over the bits of n: every partial sum stays below
-- 2 x d <= 2^53, where doubles are exact (a product a x n would not be).
local function muldiv_ceil(a, n, d)
  local q, r = 0, 0
  local bit = MAX
  local m = n
  while bit >= 1 do
    q, r = q * 2, r * 2
    if r >= d then
      q, r = q + 1, r - d
    end
    if m >= bit then
      m = m - bit
      r = r + a
      if r >= d then
        q, r = q + 1, r - d
      end
    end
    bit = bit / 2
  end
  if r > 0 then
    q = q + 1
  end
  return q
end

-- x units of permits of I0 units, in units of permits of I units, rounded
-- up (against the subject), at most cap (the new policy's B x I).
local function convert(x, I0, I, cap)
  local whole = div(x, I0)
  if whole * I >= cap then
    return cap
  end
  local v = whole * I + muldiv_ceil(x - whole * I0, I, I0)
  if v > cap then
    return cap
  end
  return v
end

-- The bucket algorithms' time unit and permit size (ALGORITHMS.md,
-- "Magnitudes"; algorithms::emission_interval in Rust): time in 1/S us, a
-- permit I units. (L, P) when B x P <= 2^52; else S = 2^k for the largest
-- k with L x 2^k <= 2^53 and B x I <= 2^52, I = ceil(P x 2^k / L).
local function bucket_scale_of(L, P, B)
  local q = floor(P / L)
  local r = P - q * L
  local s, i = L, P
  local scale = 1
  while L * scale <= 2 * MAX do
    local inc = q * scale + ceil_div(r * scale, L)
    if B * inc > MAX then
      break
    end
    s, i = scale, inc
    scale = scale * 2
  end
  return s, i
end

-- A library keeps the scales it computed (SCALES[L][P][B] = {S, I}; the
-- loop runs up to 53 times), forgotten past 4096.
local SCALES = {}
local scale_count = 0
local function bucket_scale(L, P, B)
  if B * P <= MAX then
    return L, P
  end
  local by_l = SCALES[L]
  local by_p = by_l and by_l[P]
  local known = by_p and by_p[B]
  if known ~= nil then
    return known[1], known[2]
  end
  local s, i = bucket_scale_of(L, P, B)
  if scale_count >= 4096 then
    SCALES, scale_count = {}, 0
    by_l, by_p = nil, nil
  end
  if by_l == nil then
    by_l = {}
    SCALES[L] = by_l
  end
  if by_p == nil then
    by_p = {}
    by_l[P] = by_p
  end
  by_p[B] = { s, i }
  scale_count = scale_count + 1
  return s, i
end

-- The sliding window's weight unit (algorithms::weight_unit_micros): 1 when
-- L x P <= 2^52, else the smallest power of ten dividing P with
-- L x (P / unit) <= 2^52.
local function weight_unit(L, P)
  local u = 1
  while L * (P / u) > MAX do
    u = u * 10
    if P % u ~= 0 then
      return 1
    end
  end
  return u
end

-- The string value of key, or nil when absent or of another type.
local function read_string(key)
  local value = redis.pcall('GET', key)
  if type(value) == 'string' then
    return value
  end
  return nil
end

-- Decision tables: {allowed, remaining, retry_after_us (-1 for none),
-- reset_after_us, delay_us, key, new value, expires_at_us, commit function}.
-- Fields 6-8 describe a string state to write when every policy admits;
-- field 9, when set, writes instead (the sliding log's sorted set).
local ALG = {}
