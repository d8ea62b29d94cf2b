-- `pipelined` scenario: every write carries 16 requests back to back
-- (wrk counts them by parsing the string, and expects 16 responses).
-- The request line and headers come from the command line (URL, -H), so the
-- same script serves any path or header set.
local depth = 16

init = function(args)
  local r = {}
  for i = 1, depth do
    r[i] = wrk.format()
  end
  pipelined = table.concat(r)
end

request = function()
  return pipelined
end
