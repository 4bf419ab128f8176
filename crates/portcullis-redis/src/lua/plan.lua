-- Plans by their letters: one letter per policy naming its algorithm (the
-- order of `code` in scripts/mod.rs), decoded into the list of algorithm
-- functions check.lua takes as its plan. A Functions call's ARGV[1]
-- (library.lua's `call`), and each check's plan in a batch across
-- subjects on the EVALSHA path (mixed_script.lua). After the algorithms.
--
-- plan(code): the plan of `code`, or nil for letters it does not know.
local CODES = { a = ALG.gcra, b = ALG.leaky_queue, c = ALG.token_bucket,
  d = ALG.leaky_meter, e = ALG.fixed_window, f = ALG.sliding_window,
  g = ALG.sliding_log }
-- Plans by their letters, built on first use (a few per deployment; a
-- script builds those of its call).
local PLANS = {}
local function plan(code)
  local p = PLANS[code]
  if p ~= nil then
    return p
  end
  if type(code) ~= 'string' or #code == 0 or #code > 64 then
    return nil
  end
  p = {}
  for i = 1, #code do
    local alg = CODES[string.sub(code, i, i)]
    if alg == nil then
      return nil
    end
    p[i] = alg
  end
  PLANS[code] = p
  return p
end
