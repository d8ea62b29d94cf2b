-- `claims` scenario (IPv4 Games, `tern demo`): every request claims a fresh IPv4
-- address for one of 1000 names: GET /claim?name=NAME with X-Forwarded-For: ADDRESS.
-- tern demo runs with --trusted-proxies 127.0.0.1, so it believes wrk's header as a
-- proxy's. Accept (text/plain: the short text answer) comes from the command line (-H).
--
-- Addresses: a counter-based walk over the whole IPv4 space, address = n * K mod 2^32
-- with K odd (0x9E3779B1). That is a permutation of the 2^32 addresses, so none repeats,
-- and consecutive requests land in unrelated /24s (each prefix's rate-limit bucket stays
-- full). bench/run sets BENCH_RUN (one number per wrk run): each run walks its own
-- stretch of 2^24 counter values, so rounds never reclaim earlier rounds' addresses.
-- 0.x.x.x and 127.x.x.x are skipped (this-network and loopback).
--
-- Must not define `done`: lua/report.lua is appended.

local K_HI, K_LO = 0x9E37, 0x79B1 -- K = K_HI * 2^16 + K_LO, split so products stay exact
local TWO16, TWO32 = 65536, 4294967296

local n = (BENCH_RUN or 0) * 16777216
local heads, octets

-- n * K mod 2^32 without leaving the 53-bit exact range of a Lua number
local function scramble(x)
  return (x * K_LO + ((x * K_HI) % TWO16) * TWO16) % TWO32
end

-- Each request is one concatenation of strings made in init: the request line and fixed
-- headers per name, and the four octets of the address. wrk.format and string.format per
-- request cost wrk more CPU than the server spends on the claim, so wrk was the limit and
-- the server saw fewer claims per turn than static requests (bench/run's † mark).
init = function(args)
  local words = { "ada", "bob", "cy", "dee", "eve", "fox", "gus", "hal", "ivy", "jo" }
  local seps = { "", "-", "_", "." }
  local fixed = {}
  for k, v in pairs(wrk.headers) do
    if k ~= "X-Forwarded-For" then
      fixed[#fixed + 1] = k .. ": " .. v .. "\r\n"
    end
  end
  fixed = table.concat(fixed)
  heads = {}
  for i = 0, 999 do
    local w = words[i % 10 + 1]
    local name = w .. seps[math.floor(i / 10) % 4 + 1] .. math.floor(i / 10)
    heads[i + 1] = "GET /claim?name=" .. name .. " HTTP/1.1\r\n" .. fixed .. "X-Forwarded-For: "
  end
  octets = {}
  for i = 0, 255 do
    octets[i] = tostring(i)
  end
end

request = function()
  local a
  repeat
    n = n + 1
    a = scramble(n)
    local first = math.floor(a / 16777216)
  until first ~= 0 and first ~= 127
  return heads[n % 1000 + 1] .. octets[math.floor(a / 16777216)] .. "." ..
    octets[math.floor(a / TWO16) % 256] .. "." .. octets[math.floor(a / 256) % 256] .. "." ..
    octets[a % 256] .. "\r\n\r\n"
end
