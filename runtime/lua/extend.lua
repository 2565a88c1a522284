-- Renews a worker's leases and records its heartbeat, and which leases it holds (for its next
-- incarnation: see expire_own.lua).
-- KEYS[1] <prefix>active  KEYS[2] <prefix>workers  KEYS[3] <prefix>leases:<worker>
-- ARGV[1] worker  ARGV[2] lease TTL (ms), then the tokens (any number: handled 1000 at a time)
-- Returns: per token, 1 when the lease was held (and is renewed), 0 when it was lost.
--
-- leases:<worker> holds the renewed tokens as '<length>:<token>' one after another: a token
-- carries a job's record, which may hold any byte.
local active, workers = KEYS[1], KEYS[2]
local ttl = tonumber(ARGV[2])
local time = redis.call('TIME')
-- As a string made with '%d': Redis would print a number argument as a float, once per lease.
local deadline = string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) + ttl)
redis.call('ZADD', workers, deadline, ARGV[1])
local out, held = {}, {}
for first = 3, #ARGV, 1000 do
  local last = math.min(first + 999, #ARGV)
  local scores = redis.call('ZMSCORE', active, unpack(ARGV, first, last))
  local renew = {}
  for i = first, last do
    if scores[i - first + 1] then
      out[#out + 1] = 1
      renew[#renew + 1] = deadline
      renew[#renew + 1] = ARGV[i]
      held[#held + 1] = string.format('%d:', #ARGV[i]) .. ARGV[i]
    else
      out[#out + 1] = 0
    end
  end
  if #renew > 0 then redis.call('ZADD', active, 'XX', unpack(renew)) end
end
if #held > 0 then
  redis.call('SET', KEYS[3], table.concat(held), 'PX', 2 * ttl)
else
  redis.call('DEL', KEYS[3])
end
return out
