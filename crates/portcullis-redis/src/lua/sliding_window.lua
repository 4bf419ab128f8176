-- Sliding window counter: the previous window weighted by the part still
-- inside the sliding window, plus the current one. The weight is counted in
-- units of u = weight_unit(L, P) microseconds (1 when exact), rounded up.
-- State: the string "sliding_window:<window_start_us>:<previous>:<current>".
ALG.sliding_window = function(key, L, P, B, now, c)
  local ws = now - now % P
  local prev, curr, lag, t = 0, 0, 0, now
  local value = read_string(key)
  if value ~= nil then
    local a, b, d = string.match(value, '^sliding_window:(%d+):(%d+):(%d+)$')
    if a ~= nil then
      local s_ws, s_prev, s_curr = num(a), num(b), num(d)
      if s_ws ~= nil and s_prev ~= nil and s_curr ~= nil then
        local over = s_prev > L or s_curr > L
        -- Counts above the limit (a limit that shrank) count as the limit.
        if s_prev > L then
          s_prev = L
        end
        local clamped = false
        if s_ws - now > tolerance(2 * P) then
          -- A window that starts later than clocks that disagree explain (a
          -- clock that jumped back, a corrupt value): clamped to the current
          -- window.
          prev, curr, clamped = s_prev, s_curr, true
          if curr > L then
            curr = L
          end
        elseif s_ws > now then
          -- A clock a little behind the writer's: the stored window from
          -- its start, figures measured from the real now.
          lag, ws, t = s_ws - now, s_ws, s_ws
          prev, curr, clamped = s_prev, s_curr, over
          if curr > L then
            curr = L
          end
        elseif s_ws >= ws then
          -- The same window; or a start between ws and now, which only a
          -- policy whose period changed leaves: its counts are recent, so
          -- they all count.
          prev, curr, clamped = s_prev, s_curr, over
          if curr > L then
            curr = L
          end
        elseif s_ws + P == ws then
          prev, curr, clamped = s_curr, 0, s_curr > L
          if prev > L then
            prev = L
          end
        end
        if clamped and c > 0 then
          -- Written back on a charge.
          local expires = now
          if curr > 0 then
            expires = ws + 2 * P
          elseif prev > 0 then
            expires = ws + P
          end
          if expires < now then
            expires = now
          end
          put(key, 'sliding_window:' .. fmt(ws) .. ':' .. fmt(prev) .. ':' .. fmt(curr), expires)
        end
      end
    end
  end
  local u = weight_unit(L, P)
  local units = P / u
  local e = t - ws
  local weighted = prev * (units - div(e, u))
  local cost = c
  if c == 0 then
    cost = 1
  end
  local function reset_after(current)
    if current > 0 then
      return lag + 2 * P - e
    elseif prev > 0 then
      return lag + P - e
    end
    return 0
  end
  -- Permits left once `charged` are counted: ((L - charged) x units -
  -- weighted) div units, 0 when negative.
  local function remaining(charged)
    if charged > L then
      return 0
    end
    return div(max0((L - charged) * units - weighted), units)
  end
  if curr + cost <= L and weighted <= (L - curr - cost) * units then
    if c == 0 then
      return { true, remaining(curr), -1, reset_after(curr), 0 }
    end
    local new_curr = curr + c
    local reset = reset_after(new_curr)
    return { true, remaining(new_curr), -1, reset, 0, key,
      'sliding_window:' .. fmt(ws) .. ':' .. fmt(prev) .. ':' .. fmt(new_curr), now + reset }
  end
  local retry
  if curr + cost <= L then
    retry = max0((units - div((L - curr - cost) * units, prev)) * u - e)
  else
    local room = div((L - cost) * units, curr)
    if room > units then
      room = units
    end
    retry = (P - e) + (units - room) * u
  end
  return { false, remaining(curr), lag + retry, reset_after(curr), 0 }
end
