"""The Lua scripts of the redis store: each is one atomic transition of tracker/store/base.py.

Every script gets the key prefix as ARGV[1]; keys are built from it inside the script (the store
is for one Redis server or a replica set, not Redis Cluster). Times arrive as the exact decimal
strings Python's repr() writes and are stored as given, so a value read back is bit-for-bit the
float Python computed; Lua only compares them. Layout under prefix P:

    P dev:<id>      hash  spec (JSON), agent, key, lease (absent when free)
    P devs          zset  every device id (score 0, so members sort by id)
    P devs:<key>    zset  device ids with that key
    P free          zset  ids of devices with a live agent and no lease
    P free:<key>    zset  the same, per key
    P agent:<id>    hash  address, hb, expired_at (absent while alive), devices (JSON list)
    P alive         zset  live agent id -> last heartbeat
    P dead          zset  expired agent id -> when it expired
    P lease:<id>    hash  device, user, expires, fence
    P leases        zset  lease id -> expiry
    P ended         hash  lease id -> reason it ended; P ended:order list bounds it
    P fences        hash  device id -> last fence granted
    P q             hash  request id -> JSON {r: request JSON, p: priority, s: seq, x: expiry}
    P qk:<key>      set   ids of queued requests with that key ('' = any key): GRANT reads the
                    queue only when its key's or the any-key set is not empty (a superset of the
                    live entries: every write to P q adds, every delete removes)
    P seq           counter of queue tickets
    P events        pub/sub channel: "changed" when a device was freed or a request left the
                    queue while requests are queued
"""

from __future__ import annotations

import string

from tracker.store import base

# Shared helpers, prepended to every script (Redis 7 scripts cannot share functions otherwise).
_HELPERS = """
local P = ARGV[1]
local MAX_ENDED = ${max_ended}

local function alive(agent)
  return redis.call('ZSCORE', P .. 'alive', agent) ~= false
end

local function mark_free(id, key)
  redis.call('ZADD', P .. 'free', 0, id)
  redis.call('ZADD', P .. 'free:' .. key, 0, id)
end

local function mark_busy(id, key)
  redis.call('ZREM', P .. 'free', id)
  redis.call('ZREM', P .. 'free:' .. key, id)
end

local function end_lease(lease_id, reason)
  local lk = P .. 'lease:' .. lease_id
  local dev = redis.call('HGET', lk, 'device')
  redis.call('DEL', lk)
  redis.call('ZREM', P .. 'leases', lease_id)
  if dev then
    local dk = P .. 'dev:' .. dev
    local d = redis.call('HMGET', dk, 'lease', 'agent', 'key')
    if d[1] == lease_id then
      redis.call('HDEL', dk, 'lease')
      if alive(d[2]) then mark_free(dev, d[3]) end
    end
  end
  redis.call('HSET', P .. 'ended', lease_id, reason)
  redis.call('RPUSH', P .. 'ended:order', lease_id)
  if redis.call('LLEN', P .. 'ended:order') > MAX_ENDED then
    redis.call('HDEL', P .. 'ended', redis.call('LPOP', P .. 'ended:order'))
  end
end

local function remove_device(id)
  local dk = P .. 'dev:' .. id
  local key = redis.call('HGET', dk, 'key')
  if key then
    mark_busy(id, key)
    redis.call('ZREM', P .. 'devs:' .. key, id)
  end
  redis.call('ZREM', P .. 'devs', id)
  redis.call('DEL', dk)
end

-- Only waiters need waking, and every waiter is in the queue: with the queue empty, stay quiet.
-- (A waiter queues first and then tries to grant, so a device freed before it queued is seen.)
-- With `key`, the change is a device of that key freed ("freed:<key>"): replicas with no waiter
-- for it stay idle.
local function announce(key)
  if redis.call('HLEN', P .. 'q') > 0 then
    redis.call('PUBLISH', P .. 'events', key and ('freed:' .. key) or 'changed')
  end
end

local function list_of(json)
  if not json then return {} end
  return cjson.decode(json)
end

local function ended_reason(lease_id)
  return redis.call('HGET', P .. 'ended', lease_id) or '${unknown}'
end
"""

# Values the scripts spell out, substituted as ${name} (Lua itself never uses "$").
_VALUES = {
    "max_ended": base.MAX_ENDED_LEASES,
    "unknown": base.REASON_UNKNOWN,
    "dropped": base.REASON_DEVICE_DROPPED,
    "expired": base.REASON_EXPIRED,
    "released": base.REASON_RELEASED,
    "silent": base.REASON_AGENT_SILENT,
    "deregistered": base.REASON_AGENT_DEREGISTERED,
}


def _script(body: str) -> str:
    """The helpers plus `body`, with every ${name} of _VALUES filled in."""
    return string.Template(_HELPERS + body).substitute(_VALUES)


# ARGV: P, agent_id, address, now, devices JSON [{id, key, spec}]
# -> {'taken', index, device_id, owner} | {'ok', ended lease ids...}
REGISTER = _script(
    """
local agent, address, now = ARGV[2], ARGV[3], ARGV[4]
local devs = cjson.decode(ARGV[5])
for i, d in ipairs(devs) do
  local owner = redis.call('HGET', P .. 'dev:' .. d.id, 'agent')
  if owner and owner ~= agent and alive(owner) then
    return {'taken', tostring(i - 1), d.id, owner}
  end
end
local ended = {'ok'}
local listed = {}
local ids = {}
for i, d in ipairs(devs) do
  listed[d.id] = true
  ids[i] = d.id
end
for _, id in ipairs(list_of(redis.call('HGET', P .. 'agent:' .. agent, 'devices'))) do
  if not listed[id] then
    local lease = redis.call('HGET', P .. 'dev:' .. id, 'lease')
    if lease then
      end_lease(lease, '${dropped}')
      table.insert(ended, lease)
    end
    remove_device(id)
  end
end
redis.call('HSET', P .. 'agent:' .. agent, 'address', address, 'hb', now, 'devices', ARGV[5])
redis.call('HDEL', P .. 'agent:' .. agent, 'expired_at')
redis.call('ZADD', P .. 'alive', now, agent)
redis.call('ZREM', P .. 'dead', agent)
for _, d in ipairs(devs) do
  local dk = P .. 'dev:' .. d.id
  local cur = redis.call('HMGET', dk, 'agent', 'key', 'lease')
  if cur[1] and cur[1] ~= agent then
    -- Taking over from an expired agent: its leases ended when it expired.
    local ok = P .. 'agent:' .. cur[1]
    local kept = {}
    for _, id in ipairs(list_of(redis.call('HGET', ok, 'devices'))) do
      if id ~= d.id then table.insert(kept, id) end
    end
    redis.call('HSET', ok, 'devices', #kept > 0 and cjson.encode(kept) or '[]')
    cur = {false, cur[2], false}
  end
  if cur[2] and cur[2] ~= d.key then
    mark_busy(d.id, cur[2])
    redis.call('ZREM', P .. 'devs:' .. cur[2], d.id)
  end
  redis.call('HSET', dk, 'spec', d.spec, 'agent', agent, 'key', d.key)
  redis.call('ZADD', P .. 'devs', 0, d.id)
  redis.call('ZADD', P .. 'devs:' .. d.key, 0, d.id)
  if cur[3] then mark_busy(d.id, d.key) else mark_free(d.id, d.key) end
end
redis.call('HSET', P .. 'agent:' .. agent, 'devices', #ids > 0 and cjson.encode(ids) or '[]')
announce()
return ended
"""
)

# ARGV: P, agent_id, now -> 1 | 0
HEARTBEAT = _script(
    """
local agent, now = ARGV[2], ARGV[3]
if not alive(agent) then return 0 end
redis.call('ZADD', P .. 'alive', now, agent)
redis.call('HSET', P .. 'agent:' .. agent, 'hb', now)
return 1
"""
)

# ARGV: P, agent_id -> {removed device ids, ended lease ids}
# The agent and its devices go; P fences keeps their last fences (see base.TrackerStore).
DEREGISTER = _script(
    """
local agent = ARGV[2]
local ak = P .. 'agent:' .. agent
local removed, ended = {}, {}
for _, id in ipairs(list_of(redis.call('HGET', ak, 'devices'))) do
  local d = redis.call('HMGET', P .. 'dev:' .. id, 'agent', 'lease')
  if d[1] == agent then
    if d[2] then
      end_lease(d[2], '${deregistered}')
      table.insert(ended, d[2])
    end
    remove_device(id)
    table.insert(removed, id)
  end
end
redis.call('DEL', ak)
redis.call('ZREM', P .. 'alive', agent)
redis.call('ZREM', P .. 'dead', agent)
return {removed, ended}
"""
)

# ARGV: P, request JSON {key, tags}, lease_id, now, expires, now_us, user,
#       ticket request_id ('' = new arrival), ticket priority, ticket seq, request priority
# -> false | {device_id, spec JSON, fence}
GRANT = _script(
    """
local req = cjson.decode(ARGV[2])
local lease_id, now, expires, now_us, user = ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7]
local rid, tprio, tseq, prio = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local CHUNK = 64
local tags_of = {}

local function matches(id, tags)
  if next(tags) == nil then return true end
  local t = tags_of[id]
  if t == nil then
    t = cjson.decode(redis.call('HGET', P .. 'dev:' .. id, 'spec')).tags
    tags_of[id] = t
  end
  for k, v in pairs(tags) do
    if t[k] ~= v then return false end
  end
  return true
end

-- The lowest-id free device matching key and tags that no one ahead claimed.
local function first_free(key, tags, claimed)
  local zkey = key == '' and P .. 'free' or P .. 'free:' .. key
  local start = 0
  while true do
    local ids = redis.call('ZRANGE', zkey, start, start + CHUNK - 1)
    for _, id in ipairs(ids) do
      if not claimed[id] and matches(id, tags) then return id end
    end
    if #ids < CHUNK then return nil end
    start = start + CHUNK
  end
end

local claimed = {}
-- No free device matches even before anyone ahead claims one: nothing to grant, and no need to
-- read the queue (a dispatch offering a busy key to its waiters stops here).
if not first_free(req.key, req.tags, claimed) then return false end
-- Only queued requests of this key or of any key could claim these devices: when there are none,
-- the queue is not read (16 clients on a free key do not decode 500 waiters of a busy one).
local any_key_queued = redis.call('SCARD', P .. 'qk:') > 0
local contended = req.key == '' or any_key_queued or redis.call('SCARD', P .. 'qk:' .. req.key) > 0
if contended and redis.call('HLEN', P .. 'q') > 0 then
  -- Only entries ahead whose claims could take a device this request could take matter: one
  -- with another key claims from a disjoint set, so it is skipped before sorting. Unless a
  -- request for any key is queued: it takes the first device that the entries ahead of it
  -- left, of whatever key, so then every entry counts.
  local ahead = {}
  local flat = redis.call('HGETALL', P .. 'q')
  for i = 1, #flat, 2 do
    local e = cjson.decode(flat[i + 1])
    if flat[i] ~= rid and tonumber(e.x) > now then
      local before
      if rid == '' then
        before = e.p >= prio
      else
        before = e.p > tprio or (e.p == tprio and e.s < tseq)
      end
      if before then
        e.r = cjson.decode(e.r)
        if req.key == '' or any_key_queued or e.r.key == req.key then table.insert(ahead, e) end
      end
    end
  end
  table.sort(ahead, function(a, b)
    if a.p ~= b.p then return a.p > b.p end
    return a.s < b.s
  end)
  -- Once an entry of a shape (key, no tags) found nothing, later ones of that shape find nothing
  -- either (claims only grow): 500 waiters on one key cost one ZRANGE, not 500.
  local exhausted = {}
  for _, e in ipairs(ahead) do
    local plain = next(e.r.tags) == nil
    if not (plain and exhausted[e.r.key]) then
      local id = first_free(e.r.key, e.r.tags, claimed)
      if id then
        claimed[id] = true
      elseif plain then
        exhausted[e.r.key] = true
      end
    end
  end
end
local id = first_free(req.key, req.tags, claimed)
if not id then return false end
local dk = P .. 'dev:' .. id
local d = redis.call('HMGET', dk, 'spec', 'key')
local fence = tonumber(now_us)
local previous = tonumber(redis.call('HGET', P .. 'fences', id) or '0')
if fence <= previous then fence = previous + 1 end
fence = string.format('%.0f', fence)
redis.call('HSET', P .. 'fences', id, fence)
redis.call('HSET', P .. 'lease:' .. lease_id, 'device', id, 'user', user, 'expires', expires,
  'fence', fence)
redis.call('ZADD', P .. 'leases', expires, lease_id)
redis.call('HSET', dk, 'lease', lease_id)
mark_busy(id, d[2])
if rid ~= '' then
  redis.call('HDEL', P .. 'q', rid)
  redis.call('SREM', P .. 'qk:' .. req.key, rid)
end
return {id, d[1], fence}
"""
)

# ARGV: P, lease_id, now, new expiry ('' = release)
# -> {'lost', reason} | {'ok', device_id, spec JSON, fence, user, expires}
RENEW_OR_RELEASE = _script(
    """
local lease_id, now, new_expires = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local lk = P .. 'lease:' .. lease_id
local l = redis.call('HMGET', lk, 'device', 'user', 'expires', 'fence')
if not l[1] then return {'lost', ended_reason(lease_id)} end
local freed = redis.call('HGET', P .. 'dev:' .. l[1], 'key')
if tonumber(l[3]) <= now then
  end_lease(lease_id, '${expired}')
  announce(freed)
  return {'lost', '${expired}'}
end
local spec = redis.call('HGET', P .. 'dev:' .. l[1], 'spec')
if new_expires == '' then
  end_lease(lease_id, '${released}')
  announce(freed)
  return {'ok', l[1], spec, l[4], l[2], l[3]}
end
redis.call('HSET', lk, 'expires', new_expires)
redis.call('ZADD', P .. 'leases', new_expires, lease_id)
return {'ok', l[1], spec, l[4], l[2], new_expires}
"""
)

# ARGV: P, now, agent_timeout_s, lost_device_retention_s (-1 = keep forever)
# -> {expired agents, lost devices, ended leases, pruned devices, dropped requests}
EXPIRE = _script(
    """
local now, timeout, retention = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local agents, lost, ended, pruned, dropped = {}, {}, {}, {}, {}
for _, agent in ipairs(redis.call('ZRANGEBYSCORE', P .. 'alive', '-inf', now - timeout + 1)) do
  local ak = P .. 'agent:' .. agent
  local hb = tonumber(redis.call('HGET', ak, 'hb'))
  if now - hb > timeout then
    table.insert(agents, agent)
    redis.call('ZREM', P .. 'alive', agent)
    redis.call('ZADD', P .. 'dead', ARGV[2], agent)
    redis.call('HSET', ak, 'expired_at', ARGV[2])
    for _, id in ipairs(list_of(redis.call('HGET', ak, 'devices'))) do
      table.insert(lost, id)
      local d = redis.call('HMGET', P .. 'dev:' .. id, 'lease', 'key')
      mark_busy(id, d[2])
      if d[1] then
        end_lease(d[1], '${silent}')
        table.insert(ended, d[1])
      end
    end
  end
end
for _, lease_id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', now)) do
  end_lease(lease_id, '${expired}')
  table.insert(ended, lease_id)
end
if retention >= 0 then
  for _, agent in ipairs(redis.call('ZRANGEBYSCORE', P .. 'dead', '-inf', now - retention + 1)) do
    local ak = P .. 'agent:' .. agent
    if now - tonumber(redis.call('HGET', ak, 'expired_at')) > retention then
      for _, id in ipairs(list_of(redis.call('HGET', ak, 'devices'))) do
        remove_device(id)
        redis.call('HDEL', P .. 'fences', id)
        table.insert(pruned, id)
      end
      redis.call('DEL', ak)
      redis.call('ZREM', P .. 'dead', agent)
    end
  end
end
local flat = redis.call('HGETALL', P .. 'q')
for i = 1, #flat, 2 do
  local e = cjson.decode(flat[i + 1])
  if tonumber(e.x) <= now then
    redis.call('HDEL', P .. 'q', flat[i])
    redis.call('SREM', P .. 'qk:' .. cjson.decode(e.r).key, flat[i])
    table.insert(dropped, flat[i])
  end
end
if #ended > 0 or #dropped > 0 then announce() end
return {agents, lost, ended, pruned, dropped}
"""
)

# The rows of DEVICES and LIVE_DEVICES: JSON [[spec, 'free'|'leased'|'lost', last heartbeat,
# holder, lease fence or 0], ...] for `ids`, keeping only devices with `key` ('' = all), and with
# `live_only` only those of live agents (a LOST device costs one HGET, no row). One JSON string:
# decoding one bulk reply is far faster in Python than 4,000 small ones.
_DEVICE_ROWS = """
local function device_rows(ids, key, live_only)
  local agents = {}
  local out = {}
  for _, id in ipairs(ids) do
    local dk = P .. 'dev:' .. id
    local owner = redis.call('HGET', dk, 'agent')
    local a = owner and agents[owner]
    if owner and a == nil then
      a = {alive(owner), redis.call('HGET', P .. 'agent:' .. owner, 'hb')}
      agents[owner] = a
    end
    if a and (a[1] or not live_only) then
      local d = redis.call('HMGET', dk, 'spec', 'lease', 'key')
      local spec, lease, dkey = d[1], d[2], d[3]
      if spec and (key == '' or dkey == key) then
        local state = (not a[1]) and 'lost' or (lease and 'leased' or 'free')
        local holder, fence = '', '0'
        if lease then
          local l = redis.call('HMGET', P .. 'lease:' .. lease, 'user', 'fence')
          holder, fence = l[1] or '', l[2] or '0'
        end
        -- The spec goes out as the JSON text it is stored as, in a JSON string: the tracker
        -- decodes each distinct text once (RedisStore's spec cache), not once per listing.
        table.insert(out, '[' .. cjson.encode(spec) .. ',"' .. state .. '",' .. cjson.encode(a[2])
          .. ',' .. cjson.encode(holder) .. ',' .. fence .. ']')
      end
    end
  end
  return '[' .. table.concat(out, ',') .. ']'
end
"""

# ARGV: P, key ('' = all), after ('-' = from the first, '(<id>' = ids after <id>), limit (0 = all)
#   -> device_rows of those ids, sorted by id
DEVICES = _script(
    _DEVICE_ROWS
    + """
local key, after, limit = ARGV[2], ARGV[3], tonumber(ARGV[4])
local zset = key == '' and P .. 'devs' or P .. 'devs:' .. key
local ids
if limit > 0 then
  ids = redis.call('ZRANGEBYLEX', zset, after, '+', 'LIMIT', 0, limit)
else
  ids = redis.call('ZRANGEBYLEX', zset, after, '+')
end
return device_rows(ids, '', false)
"""
)

# ARGV: P, JSON list of device ids -> device_rows of those that exist
DEVICES_BY_ID = _script(
    _DEVICE_ROWS
    + """
return device_rows(cjson.decode(ARGV[2]), '', false)
"""
)

# ARGV: P, key ('' = all) -> device_rows of the live agents' devices with that key: for a key,
# its own index (skipping LOST devices before reading them); for all keys, the live agents' lists.
LIVE_DEVICES = _script(
    _DEVICE_ROWS
    + """
local key = ARGV[2]
if key ~= '' then
  return device_rows(redis.call('ZRANGE', P .. 'devs:' .. key, 0, -1), key, true)
end
local ids = {}
for _, agent in ipairs(redis.call('ZRANGE', P .. 'alive', 0, -1)) do
  for _, id in ipairs(list_of(redis.call('HGET', P .. 'agent:' .. agent, 'devices'))) do
    table.insert(ids, id)
  end
end
return device_rows(ids, '', true)
"""
)

# ARGV: P, now -> JSON [[key, tags, count], ...]: live queued requests counted per key and tag
# selector (a shape may come in a few rows, one per order its tags were written in)
QUEUED_SHAPES = _script(
    """
local now = tonumber(ARGV[2])
local counts, shapes = {}, {}
local flat = redis.call('HGETALL', P .. 'q')
for i = 2, #flat, 2 do
  local e = cjson.decode(flat[i])
  if tonumber(e.x) > now then
    local r = cjson.decode(e.r)
    local tags = cjson.encode(r.tags)
    local shape = r.key .. '\0' .. tags
    if counts[shape] == nil then
      counts[shape] = 0
      table.insert(shapes, {shape, r.key, tags})
    end
    counts[shape] = counts[shape] + 1
  end
end
local out = {}
for i, s in ipairs(shapes) do
  out[i] = '[' .. cjson.encode(s[2]) .. ',' .. s[3] .. ',' .. counts[s[1]] .. ']'
end
return '[' .. table.concat(out, ',') .. ']'
"""
)

# ARGV: P, request_id, request JSON, priority, now, expiry -> {priority, seq}
ENQUEUE = _script(
    """
local rid, now, expires = ARGV[2], tonumber(ARGV[5]), ARGV[6]
local qk = P .. 'q'
local old = redis.call('HGET', qk, rid)
if old then
  local e = cjson.decode(old)
  if tonumber(e.x) > now then
    e.x = expires
    redis.call('HSET', qk, rid, cjson.encode(e))
    return {e.p, e.s}
  end
end
local seq = redis.call('INCR', P .. 'seq')
local prio = tonumber(ARGV[4])
redis.call('HSET', qk, rid, cjson.encode({r = ARGV[3], p = prio, s = seq, x = expires}))
redis.call('SADD', P .. 'qk:' .. cjson.decode(ARGV[3]).key, rid)
return {prio, seq}
"""
)

# ARGV: P, request_id -> 1 | 0
DEQUEUE = _script(
    """
local old = redis.call('HGET', P .. 'q', ARGV[2])
if old then
  redis.call('HDEL', P .. 'q', ARGV[2])
  redis.call('SREM', P .. 'qk:' .. cjson.decode(cjson.decode(old).r).key, ARGV[2])
  announce()
  return 1
end
return 0
"""
)
