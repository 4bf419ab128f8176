-- What the two batches across subjects do alike (mixed.lua, the
-- library's; mixed_script.lua, the EVALSHA path's): check the batch's runs
-- before any check runs, refill one table of keys and one of arguments per
-- check, read TIME once for the batch, and answer a failed check alone.
-- After the prelude, before either.
--
-- A batch's layout, both paths: ARGV[1] = m, the number of checks; then
-- runs, in the order the checks are decided: `<name> <nk> <na> <n>` (what
-- each check of the run is sent to: a function's name, or a plan's
-- letters on the EVALSHA path; its number of keys; its number of
-- arguments, at least 1; how many consecutive checks the run holds, at
-- least 1), then the n checks' arguments, na each. KEYS: every check's
-- keys, nk each, in the same order. Consecutive checks sent to the same
-- name with the same counts share a run, so a batch of one policy set
-- names it once (every argument costs Redis about 0.8k instructions).
--
-- whole(text, most): `text` as a whole number from 0 to `most`, else nil
-- (tonumber reads 'inf', 'nan', '1.5' and '-2' too).
local function whole(text, most)
  local n = tonumber(text)
  if n == nil or n < 0 or n > most or n ~= math.floor(n) then
    return nil
  end
  return n
end

-- batch_error(keys, args, known, names): nil when ARGV lays out a batch as
-- above, its runs covering exactly m checks, KEYS and ARGV, each named as
-- `known(name)` accepts; else the error reply (`names` is what a run names,
-- for its text). Read before any check runs, so a malformed batch writes
-- nothing and never reads past KEYS or ARGV.
local function batch_error(keys, args, known, names)
  local m = whole(args[1], #args)
  if m == nil or m < 1 then
    return redis.error_reply('ERR portcullis: a mixed batch starts with its number of checks; upgrade portcullis-redis')
  end
  local a, k, j = 2, 0, 0
  while j < m do
    local nk, na, n = whole(args[a + 1], #keys), whole(args[a + 2], #args), whole(args[a + 3], m - j)
    if nk == nil or na == nil or n == nil or na < 1 or n < 1 or not known(args[a])
      or k + n * nk > #keys or a + 3 + n * na > #args then
      return redis.error_reply('ERR portcullis: a mixed batch names an unknown ' .. names .. ' or miscounts; upgrade portcullis-redis')
    end
    k = k + n * nk
    a = a + 4 + n * na
    j = j + n
  end
  if k ~= #keys or a ~= #args + 1 then
    return redis.error_reply('ERR portcullis: a mixed batch has arguments left over; upgrade portcullis-redis')
  end
  return nil
end

-- refill(t, from, first, n): t[1..n] = from[first + 1 .. first + n], and
-- whatever t held past n cleared (no table per check; the functions keep
-- nothing of them).
local function refill(t, from, first, n)
  for i = 1, n do
    t[i] = from[first + i]
  end
  local i = n + 1
  while t[i] ~= nil do
    t[i] = nil
    i = i + 1
  end
end

-- batch_now(now): `now`, else Redis' TIME in µs as text: the batch's one
-- reading for the checks sent without a client time (a TIME is a call
-- into Redis; these checks arrived together).
local function batch_now(now)
  if now ~= nil then
    return now
  end
  local time = redis.call('TIME')
  return fmt(tonumber(time[1]) * 1000000 + tonumber(time[2]))
end

-- each_reply(ok, reply): what pcall of a check gave, as the batch's reply
-- for it: the reply, or the status `FAILED <error>` on one line for a
-- check that failed (an error inside the array would fail the whole reply
-- at the client, whose other checks ran).
local function each_reply(ok, reply)
  local failed = not ok and reply or (type(reply) == 'table' and reply.err)
  if not failed then
    return reply
  end
  if type(failed) == 'table' then
    failed = failed.err
  end
  return redis.status_reply('FAILED ' .. string.gsub(tostring(failed), '[\r\n]', ' '))
end
