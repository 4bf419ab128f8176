-- What the two batches across subjects do alike for each check (mixed.lua,
-- the library's; mixed_script.lua, the EVALSHA path's): refill one table
-- of keys and one of arguments per check, read TIME once for the batch,
-- and answer a failed check alone. After the prelude, before either.
--
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
