-- tollgate: shared helpers for every script (see ALGORITHMS.md in tollgate-core).
--
-- All numbers are non-negative integers below 2^53, exact in Lua's doubles.
-- Numbers passed to redis.call are formatted with fmt(): Lua's default
-- number-to-string conversion prints 14 significant digits and would round
-- a microsecond timestamp.
local floor = math.floor

-- a div b, for 0 <= a <= 2^53 and b >= 1.
local function div(a, b)
  return floor(a / b)
end

-- ceil(a / b), for 0 <= a <= 2^53 and b >= 1 (never forms a + b - 1, which
-- could pass 2^53).
local function ceil_div(a, b)
  local q = floor(a / b)
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
