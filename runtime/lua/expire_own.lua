-- A worker that starts again under the same id: the leases its previous incarnation held at its
-- last heartbeat expire now, so the next reap (by any worker) sends their jobs back at once
-- instead of after their TTL. Worker ids must be unique among live workers.
-- The answers kept for its finish calls go too: no call of the previous incarnation is sent again.
-- KEYS[1] <prefix>active  KEYS[2] <prefix>leases:<worker>  KEYS[3] <prefix>answers:<worker>
-- Returns: how many leases were expired.
local active, list = KEYS[1], KEYS[2]
local held = redis.call('GET', list)
redis.call('DEL', list, KEYS[3])
if not held then return 0 end
local n, pos = 0, 1
while pos <= #held do -- '<length>:<token>' one after another (see extend.lua)
  local colon = string.find(held, ':', pos, true)
  if not colon then break end
  local len = tonumber(string.sub(held, pos, colon - 1))
  if not len then break end
  local token = string.sub(held, colon + 1, colon + len)
  if redis.call('ZSCORE', active, token) then
    redis.call('ZADD', active, 'XX', 0, token)
    n = n + 1
  end
  pos = colon + len + 1
end
return n
