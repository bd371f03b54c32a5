"""The Lua source of the local gateway's body router (downstream) and model rewriter (upstream).

Kept as a Python string so that it ships with the package like any module. See the comment at its
top for what it does; ``gennstack.gateway.local`` prepends the routing table.
"""

SOURCE = r"""
-- GenNStack local gateway: route an OpenAI-compatible request on its JSON body's "model".
--
-- Plain Envoy cannot read a request body for routing. This script runs twice:
--   * downstream (before routing): it validates the whole body as JSON (a small recursive-descent
--     parser, since Envoy's Lua has no JSON library), answers 400 for malformed JSON or a missing
--     "model", 404 for a path outside PATHS or a model the routing table does not know (with the
--     AI Gateway's own texts), sets stream_options.include_usage on streaming chat completions
--     (as the AI Gateway does when token costs are configured), and otherwise sets the
--     x-ai-eg-model header (the header the Envoy AI Gateway routes on in the cluster) and clears the
--     route cache so the router matches on it;
--   * upstream (after a backend has been picked, once per attempt): when the chosen backend serves
--     another model name than the client asked for (an alias such as gennstack-default, or a
--     fallback), it rewrites "model" in the body, as the AI Gateway's modelNameOverride does.
-- The Python side prepends `local MODE = "downstream"|"upstream"`, `local MODELS = {...}`,
-- `local PATHS = {...}` (the accepted POST paths) and `local NO_ROUTE = "..."`.

local MAX_DEPTH = 64

local function parse(s)
  -- Returns the top-level "model" value (or nil), its kind, its byte span [first, last], and
  -- FIELDS: every top-level key -> {kind = ..., first = ..., last = ...} (its value's span).
  local pos, n = 1, #s
  local model, kind, first, last = nil, nil, nil, nil
  local fields = {}
  local str_value = nil
  local escapes = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' }

  local function fail(msg)
    error({ msg = msg .. " at byte " .. pos }, 0)
  end

  local function ws()
    pos = s:find("[^ \t\r\n]", pos) or (n + 1)
  end

  local function utf8(cp)
    if cp < 0x80 then return string.char(cp) end
    if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end

  local function str()
    pos = pos + 1
    local parts = {}
    while true do
      local i = s:find('["\\%z\1-\31]', pos)
      if not i then fail("unterminated string") end
      local c = s:sub(i, i)
      parts[#parts + 1] = s:sub(pos, i - 1)
      if c == '"' then
        pos = i + 1
        return table.concat(parts)
      elseif c == "\\" then
        local e = s:sub(i + 1, i + 1)
        if escapes[e] then
          parts[#parts + 1] = escapes[e]
          pos = i + 2
        elseif e == "u" then
          local hex = s:sub(i + 2, i + 5)
          if not hex:match("^%x%x%x%x$") then pos = i; fail("invalid \\u escape") end
          parts[#parts + 1] = utf8(tonumber(hex, 16))
          pos = i + 6
        else
          pos = i
          fail("invalid escape")
        end
      else
        pos = i
        fail("unescaped control character in string")
      end
    end
  end

  local function digits(i)
    return s:find("[^0-9]", i) or (n + 1)
  end

  local function number()
    local i = pos
    if s:sub(i, i) == "-" then i = i + 1 end
    local c = s:sub(i, i)
    if c == "0" then
      i = i + 1
    elseif c:match("^[1-9]$") then
      i = digits(i)
    else
      fail("invalid number")
    end
    if s:sub(i, i) == "." then
      local j = digits(i + 1)
      if j == i + 1 then pos = i; fail("invalid number") end
      i = j
    end
    c = s:sub(i, i)
    if c == "e" or c == "E" then
      i = i + 1
      c = s:sub(i, i)
      if c == "+" or c == "-" then i = i + 1 end
      local j = digits(i)
      if j == i then pos = i; fail("invalid number") end
      i = j
    end
    pos = i
  end

  local value

  local function object(depth, top)
    pos = pos + 1
    ws()
    if s:sub(pos, pos) == "}" then pos = pos + 1; return end
    while true do
      if s:sub(pos, pos) ~= '"' then fail("expected a string key") end
      local key = str()
      ws()
      if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
      pos = pos + 1
      ws()
      local start = pos
      local k = value(depth + 1)
      if top then fields[key] = { kind = k, first = start, last = pos - 1 } end
      if top and key == "model" then
        kind, first, last = k, start, pos - 1
        if k == "string" then model = str_value end
      end
      ws()
      local c = s:sub(pos, pos)
      pos = pos + 1
      if c == "}" then return end
      if c ~= "," then pos = pos - 1; fail("expected ',' or '}'") end
      ws()
    end
  end

  local function array(depth)
    pos = pos + 1
    ws()
    if s:sub(pos, pos) == "]" then pos = pos + 1; return end
    while true do
      value(depth + 1)
      ws()
      local c = s:sub(pos, pos)
      pos = pos + 1
      if c == "]" then return end
      if c ~= "," then pos = pos - 1; fail("expected ',' or ']'") end
      ws()
    end
  end

  value = function(depth)
    if depth > MAX_DEPTH then fail("nested deeper than " .. MAX_DEPTH) end
    local c = s:sub(pos, pos)
    if c == "{" then object(depth, false); return "object"
    elseif c == "[" then array(depth); return "array"
    elseif c == '"' then str_value = str(); return "string"
    elseif c == "-" or c:match("^%d$") then number(); return "number"
    elseif s:sub(pos, pos + 3) == "true" then pos = pos + 4; return "boolean"
    elseif s:sub(pos, pos + 4) == "false" then pos = pos + 5; return "boolean"
    elseif s:sub(pos, pos + 3) == "null" then pos = pos + 4; return "null"
    elseif c == "" then fail("unexpected end of input")
    else fail("unexpected character '" .. c .. "'") end
  end

  ws()
  if s:sub(pos, pos) ~= "{" then fail("the body must be a JSON object") end
  object(0, true)
  ws()
  if pos <= n then fail("unexpected data after the JSON object") end
  return model, kind, first, last, fields
end

local function is_true(raw, field)
  return field ~= nil and field.kind == "boolean" and raw:sub(field.first, field.last) == "true"
end

local function with_usage(raw, fields)
  -- The AI Gateway's chat completions request rule (endpointspec.go): a streaming request gets
  -- stream_options.include_usage = true, so that every stream ends with its token counts.
  -- Returns the rewritten body, or nil when it needs no change.
  if not is_true(raw, fields["stream"]) then return nil end
  local options = fields["stream_options"]
  if options == nil then
    local open = raw:find("{", 1, true)
    return raw:sub(1, open) .. '"stream_options":{"include_usage":true},' .. raw:sub(open + 1)
  elseif options.kind == "null" then
    return raw:sub(1, options.first - 1) .. '{"include_usage":true}' .. raw:sub(options.last + 1)
  elseif options.kind == "object" then
    local inner = raw:sub(options.first, options.last)
    local _, _, _, _, inner_fields = parse(inner)
    if is_true(inner, inner_fields["include_usage"]) then return nil end
    -- appended last: JSON parsers keep the last of duplicate keys (Python's, Go's)
    local empty = inner:sub(2, -2):find("[^ \t\r\n]") == nil
    return raw:sub(1, options.last - 1) .. (empty and "" or ",") .. '"include_usage":true' .. raw:sub(options.last)
  end
  return nil -- another kind: the model server rejects it
end

local function quote(text)
  local out = text:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
    return string.format("\\u%04x", c:byte())
  end)
  return '"' .. out .. '"'
end

local function reject(handle, status, message)
  -- The listener's local_reply_config turns the message into an OpenAI-style JSON error.
  handle:respond({ [":status"] = tostring(status), ["content-type"] = "text/plain" }, message)
end

local function downstream(handle)
  local headers = handle:headers()
  headers:remove("x-ai-eg-model") -- never trust a client's copy
  headers:remove("x-gennstack-served-model")
  local path = headers:get(":path") or ""
  local bare = path:match("^[^?]*")
  local method = headers:get(":method")
  if method == "GET" and bare == "/v1/models" then return end
  if method ~= "POST" or not PATHS[bare] then
    -- the AI Gateway's external processor's answer to a path it has no processor for
    return reject(handle, 404, "unsupported path: " .. path)
  end
  local body = handle:body() -- yields until the whole body is buffered
  headers = handle:headers() -- objects from before a yield are out of scope after it
  if body == nil or body:length() == 0 then
    return reject(handle, 400, 'the request body is empty; send a JSON object with a "model"')
  end
  local raw = body:getBytes(0, body:length())
  local ok, model, kind, _, _, fields = pcall(parse, raw)
  if not ok then
    return reject(handle, 400, "the request body is not valid JSON: " .. (type(model) == "table" and model.msg or tostring(model)))
  end
  if kind == nil then return reject(handle, 400, 'the request body has no "model"') end
  if kind ~= "string" or model == "" then return reject(handle, 400, '"model" must be a non-empty string') end
  if not MODELS[model] then
    return reject(handle, 404, NO_ROUTE)
  end
  if bare == "/v1/chat/completions" then
    local rewritten = with_usage(raw, fields)
    if rewritten ~= nil then
      body:setBytes(rewritten)
      headers:replace("content-length", tostring(#rewritten))
    end
  end
  headers:replace("x-ai-eg-model", model)
  handle:clearRouteCache()
end

local function upstream(handle)
  local headers = handle:headers()
  local served = headers:get("x-gennstack-served-model")
  headers:remove("x-gennstack-served-model")
  if served == nil or served == "" or served == headers:get("x-ai-eg-model") then return end
  local body = handle:body()
  if body == nil then return end
  headers = handle:headers()
  local raw = body:getBytes(0, body:length())
  local ok, _, kind, first, last = pcall(parse, raw)
  if not ok or kind ~= "string" then return end
  local rewritten = raw:sub(1, first - 1) .. quote(served) .. raw:sub(last + 1)
  body:setBytes(rewritten)
  headers:replace("content-length", tostring(#rewritten))
end

function envoy_on_request(handle)
  if MODE == "upstream" then upstream(handle) else downstream(handle) end
end
"""
