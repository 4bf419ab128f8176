-- Fixed window aligned to multiples of P since the epoch.
-- State: the string "fixed_window:<window_start_us>:<count>"; it expires at
-- the window's end.
ALG.fixed_window = function(key, L, P, B, now, c)
  local ws = now - now % P
  local count = 0
  local value = read_string(key)
  if value ~= nil then
    local a, b = string.match(value, '^fixed_window:(%d+):(%d+)$')
    if a ~= nil then
      local s_ws, s_count = num(a), num(b)
      if s_ws == nil or s_count == nil then
        -- No state.
      elseif s_ws - now > tolerance(P) then
        -- A window that starts later than clocks that disagree explain (a
        -- clock that jumped back, a corrupt value): clamped to the current
        -- window, at most full, written back on a charge.
        count = s_count
        if count > L then
          count = L
        end
        if c > 0 then
          local expires = now
          if count > 0 then
            expires = ws + P
          end
          put(key, 'fixed_window:' .. fmt(ws) .. ':' .. fmt(count), expires)
        end
      elseif s_ws >= ws then
        ws, count = s_ws, s_count
        if count > L then
          -- More than this policy admits in a window: clamped, written
          -- back on a charge (the key then expires at this window's end).
          count = L
          if c > 0 then
            put(key, 'fixed_window:' .. fmt(ws) .. ':' .. fmt(count), ws + P)
          end
        end
      end
    end
  end
  local window_end = ws + P
  -- Until the window ends when it holds anything; 0 for an empty window
  -- (a charge makes it non-empty, so it uses window_end - now).
  local reset = 0
  if count > 0 then
    reset = window_end - now
  end
  local cost = c
  if c == 0 then
    cost = 1
  end
  if count + cost <= L then
    if c == 0 then
      return { true, L - count, -1, reset, 0 }
    end
    local new_count = count + c
    return { true, L - new_count, -1, window_end - now, 0, key,
      'fixed_window:' .. fmt(ws) .. ':' .. fmt(new_count), window_end }
  end
  return { false, max0(L - count), window_end - now, reset, 0 }
end
