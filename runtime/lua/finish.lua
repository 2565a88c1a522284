-- Acks or fails leased jobs, each checked against its token.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>active  KEYS[3] <prefix>fence  KEYS[4] <prefix>stats
-- KEYS[5] <prefix>ids  KEYS[6] <prefix>dead  KEYS[7] <prefix>dead:info  KEYS[8] <prefix>finished:<worker>
-- ARGV[1] lease TTL (ms)  ARGV[2] n  ARGV[3] call id, then n times: token, kind ('a' ack, 'f' fail),
--   producer-given id ('' if none), error, want next ('1': lease the group's next job to me;
--   '2': only when no other lane is waiting, so a burst costs nobody their turn; '0': no)
-- Returns: n times: held (1, or 0 when the lease was lost and nothing changed), next token,
--   next record ('' and '' when no next job was leased)
--
-- Safe to send again: a worker has one finish call in flight at a time, and the result of its
-- last call is kept under finished:<worker>. The same call id again (a resend after a lost
-- reply) gets that result back and changes nothing; without it, a burst's next job leased by
-- the first run would belong to nobody.
local ready, active, fence_key, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ids, dead, dead_info, finished = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local prefix = string.sub(ready, 1, -6)
local ttl, n, call = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

-- The cache holds '<call id>\n' and then, for each reply element, '<length>:<text>' (held flags
-- as '0'/'1'): cheap to write on every call, decoded only on a resend.
local last = redis.call('GET', finished)
if last then
  local sep = string.find(last, '\n', 1, true)
  if sep and string.sub(last, 1, sep - 1) == call then
    local out, pos = {}, sep + 1
    while pos <= #last do
      local colon = string.find(last, ':', pos, true)
      local len = tonumber(string.sub(last, pos, colon - 1))
      local text = string.sub(last, colon + 1, colon + len)
      if #out % 3 == 0 then out[#out + 1] = tonumber(text) else out[#out + 1] = text end
      pos = colon + len + 1
    end
    return out
  end
end

local function done(out)
  local parts = {call, '\n'}
  for i = 1, #out do
    local text = tostring(out[i])
    parts[#parts + 1] = #text .. ':' .. text
  end
  redis.call('SET', finished, table.concat(parts), 'PX', 600000)
  return out
end

local tokens = {}
for i = 1, n do tokens[i] = ARGV[4 + (i - 1) * 5] end
local scores = redis.call('ZMSCORE', active, unpack(tokens))
local held, seen = {}, {}
for i = 1, n do
  if scores[i] and not seen[tokens[i]] then -- a token given twice is held once
    seen[tokens[i]] = true
    held[#held + 1] = tokens[i]
  else
    scores[i] = false
  end
end
if #held == 0 then
  local out = {}
  for i = 1, n do out[#out + 1] = 0; out[#out + 1] = ''; out[#out + 1] = '' end
  return done(out)
end
redis.call('ZREM', active, unpack(held))

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local out, back, nexts = {}, {}, {}
local completed, failed = 0, 0
local nobody_waits = nil -- LLEN of ready, asked once: this script pushes to ready only at its end
for i = 1, n do
  local base = 4 + (i - 1) * 5
  local token, kind, unique_id, err, want = ARGV[base], ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], ARGV[base + 4]
  local next_token, next_record = '', ''
  if not scores[i] then
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
    if unique_id ~= '' then redis.call('SREM', ids, unique_id) end
    local lane = string.sub(token, string.find(token, '|', 1, true) + 1)
    local record
    if string.sub(lane, 1, 2) == 'g:' then
      local key = prefix .. lane
      record = redis.call('LPOP', key)
      local following = redis.call('LINDEX', key, 0)
      if following then
        if want == '2' and nobody_waits == nil then nobody_waits = redis.call('LLEN', ready) == 0 end
        if kind == 'a' and (want == '1' or (want == '2' and nobody_waits and #back == 0)) then
          nexts[#nexts + 1] = {i = #out + 1, lane = lane} -- its token is made below, with its fence
          next_token = lane
          next_record = following
        else
          back[#back + 1] = lane -- round robin: the group waits behind every other lane
        end
      end
    else
      record = string.sub(lane, 3)
    end
    if kind == 'a' then
      completed = completed + 1
    else
      failed = failed + 1
      local id = string.match(record or '', '^%d+|([^|]*)|') or ''
      redis.call('ZADD', dead, now, id)
      redis.call('HSET', dead_info, id, cjson.encode({record = record, error = err, at = now}))
    end
  end
  out[#out + 1] = next_token
  out[#out + 1] = next_record
end
if #back > 0 then redis.call('RPUSH', ready, unpack(back)) end
if #nexts > 0 then -- one INCRBY for every fence, given out in item order
  local fence = redis.call('INCRBY', fence_key, #nexts) - #nexts
  local leases = {}
  for _, n in ipairs(nexts) do
    fence = fence + 1
    out[n.i] = fence .. '|' .. n.lane
    leases[#leases + 1] = now + ttl
    leases[#leases + 1] = out[n.i]
  end
  redis.call('ZADD', active, unpack(leases))
  redis.call('HINCRBY', stats, 'started', #nexts)
end
if completed > 0 then redis.call('HINCRBY', stats, 'completed', completed) end
if failed > 0 then redis.call('HINCRBY', stats, 'failed', failed) end
return done(out)
