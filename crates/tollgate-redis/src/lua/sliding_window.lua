-- Sliding window counter: the previous window weighted by the part still
-- inside the sliding window, plus the current one.
-- State: the string "sliding_window:<window_start_us>:<previous>:<current>".
ALG.sliding_window = function(key, L, P, B, now, c)
  local ws = now - now % P
  local prev, curr, lag, t = 0, 0, 0, now
  local value = read_string(key)
  if value ~= nil then
    local a, b, d = string.match(value, '^sliding_window:(%d+):(%d+):(%d+)$')
    if a ~= nil then
      local s_ws, s_prev, s_curr = tonumber(a), tonumber(b), tonumber(d)
      if s_ws == ws or (s_ws > ws and s_ws <= now) then
        -- The same window; or a start between ws and now, which only a
        -- policy whose period changed leaves: its counts are recent, so
        -- they all count.
        prev, curr = s_prev, s_curr
      elseif s_ws + P == ws then
        prev, curr = s_curr, 0
      elseif s_ws > now then
        -- The clock went back.
        lag, ws, t = s_ws - now, s_ws, s_ws
        prev, curr = s_prev, s_curr
      end
    end
  end
  local e = t - ws
  local w = P - e
  local cost = c
  if c == 0 then
    cost = 1
  end
  local capacity = L * P
  local weighted = prev * w
  local function reset_after(current)
    if current > 0 then
      return lag + 2 * P - e
    elseif prev > 0 then
      return lag + P - e
    end
    return 0
  end
  if weighted + (curr + cost) * P <= capacity then
    if c == 0 then
      return { true, div(capacity - weighted - curr * P, P), -1, reset_after(curr), 0 }
    end
    local new_curr = curr + c
    local reset = reset_after(new_curr)
    return { true, div(capacity - weighted - new_curr * P, P), -1, reset, 0, key,
      'sliding_window:' .. fmt(ws) .. ':' .. fmt(prev) .. ':' .. fmt(new_curr), now + reset }
  end
  local retry
  if curr + cost <= L then
    retry = P - div((L - curr - cost) * P, prev) - e
  else
    retry = (P - e) + P - div((L - cost) * P, curr)
  end
  return { false, div(max0(capacity - weighted - curr * P), P), lag + retry, reset_after(curr), 0 }
end
