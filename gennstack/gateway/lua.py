"""The Lua source of the local gateway's body router (downstream) and model rewriter (upstream).

Kept as Python strings so that they ship with the package like any module. See the comments in
them for what they do. :data:`SOURCE` is the local gateway's stand-in for the AI Gateway's external
processor (``gennstack.gateway.local`` prepends the routing table): it validates the body and sets the
model header. :func:`prefix_key_script` is the prefix key's script, the cluster's EnvoyExtensionPolicy
and, at the same place in the filter chain, the local gateway's second Lua filter, so both gateways key
a request with one code.

Where the cluster runs it: after the AI Gateway's external processor. Envoy Gateway v1.8.3 orders its
filters Lua (12) before ext_proc (100) (internal/xds/translator/httpfilters.go newOrderedHTTPFilter), but
the AI Gateway v1.1.0 extension server then inserts its own ext_proc ahead of the first ext_proc, wasm,
Lua, RBAC, rate-limit ... or router filter (internal/extensionserver/post_translate_modify.go
insertAIGatewayExtProcFilter, afterExtProcFilterPrefixes; after the last buffer filter only when one
sits at or after that point: GenNStack has none). That processor buffers the body (RequestBodyMode
BUFFERED), answers a malformed one itself, and sets x-ai-eg-model (processor_impl.go: the body
response's header mutation, ModelNameHeaderKeyDefault) before this filter sees the request; the global
rate limit (303) runs after it. So the script returns at once for a model that does not route by prefix
(:data:`MODEL_HEADER` not in ``PREFIX_MODELS``: no body buffered, nothing read), and otherwise reads at
most :func:`scan_bytes` bytes of the body with a scanner that neither recurses nor validates: the work
of one request is bounded by that window, whatever the body holds (huge arrays, many small elements,
deep nesting). A prompt that starts beyond the window gets no key (a random server).
"""

import json

# The paths the gateway forwards (POST, JSON body with "model"): the OpenAI endpoints of the AI
# Gateway v1.1.0's external processor (cmd/extproc/mainlib/main.go) that vLLM also serves. Anything
# else gets the AI Gateway's own "unsupported path" 404 (internal/extproc/server.go).
ACCEPTED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
# The header the AI Gateway routes on (AI Gateway v1.1.0 api/v1beta1 AIModelHeaderKey), set from the body's
# "model" by its external processor in the cluster and by the local body router locally.
MODEL_HEADER = "x-ai-eg-model"
# The top-level fields the prefix key reads (prompt_prefix below).
PROMPT_FIELDS = ("messages", "prompt", "instructions", "input")


def scan_bytes(prefix_bytes: int) -> int:
    """The most bytes of a body the prefix key's script reads: 64 KiB, or 8 x ``prefix_bytes`` when
    larger (room for JSON keys, escapes and roles around the prefix's text)."""
    return max(64 * 1024, 8 * prefix_bytes)

PARSER = r"""
-- GenNStack local gateway: route an OpenAI-compatible request on its JSON body's "model".
--
-- Plain Envoy cannot read a request body for routing. This script runs twice:
--   * downstream (before routing): it validates the whole body as JSON (a small recursive-descent
--     parser, since Envoy's Lua has no JSON library), answers 400 for malformed JSON or a missing
--     "model", 404 for a path outside PATHS or a model the routing table does not know (with the
--     AI Gateway's own texts), sets stream_options.include_usage on streaming chat completions
--     (as the AI Gateway does when token costs are configured), and otherwise sets the
--     x-ai-eg-model header (the header the Envoy AI Gateway routes on in the cluster) and clears the
--     route cache so the router matches on it: what the AI Gateway's external processor does in the
--     cluster; the prefix key is a second Lua filter after this one, the cluster's own script (KEY);
--   * upstream (after a backend has been picked, once per attempt): when the chosen backend serves
--     another model name than the client asked for (an alias such as gennstack-default, or a
--     fallback), it rewrites "model" in the body, as the AI Gateway's modelNameOverride does.
-- The Python side prepends `local MODE = "downstream"|"upstream"`, `local MODELS = {...}`,
-- `local NO_ROUTE = "..."` and `local PATHS = {...}` (the accepted POST paths).

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

"""

KEY = r"""
-- Prefix key (prefix-aware routing, docs/gateway.md). The key of a request is a hash of the first
-- PREFIX_BYTES bytes of its prompt as the model sees it: the decoded string values of the leading
-- messages, up to and including the first user message (system prompt, tools, first user turn),
-- each followed by a NUL. Every later turn of a conversation resends those messages, so it gets the
-- same key; requests whose system prompt alone is PREFIX_BYTES long share one key. A client's
-- SESSION_HEADER replaces it. Pure Lua 5.1 (no `bit` library: Envoy Gateway validates scripts with
-- gopher-lua): two polynomial hashes modulo primes below 2^31, exact in doubles.

local KEY_ESCAPES = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' }

local function key_utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

local function decode_at(s, i)
  -- s:sub(i, i) is an opening quote: the string's text and the byte after it, or nil when it does not
  -- end within s (the window cut it).
  local parts, pos = {}, i + 1
  while true do
    local j = s:find('["\\]', pos)
    if j == nil then return nil end
    parts[#parts + 1] = s:sub(pos, j - 1)
    if s:sub(j, j) == '"' then return table.concat(parts), j + 1 end
    local e = s:sub(j + 1, j + 1)
    if e == "u" then
      parts[#parts + 1] = key_utf8(tonumber(s:sub(j + 2, j + 5), 16))
      pos = j + 6
    else
      parts[#parts + 1] = KEY_ESCAPES[e] or e
      pos = j + 2
    end
  end
end

local function leading_strings(s, first, last, limit, messages)
  -- The string values (not keys) in s[first..last], in order, each followed by "\0", until limit
  -- bytes; for a messages array, only up to the end of the first element whose "role" is "user".
  local out, size, pos, depth, user, key = {}, 0, first, 0, false, nil
  while pos <= last and size < limit do
    local i = s:find('[%[%]{}"]', pos)
    if i == nil or i > last then break end
    local c = s:sub(i, i)
    if c == '"' then
      local text, after = decode_at(s, i)
      if text == nil then break end
      local j = s:find("[^ \t\r\n]", after) or (#s + 1)
      if s:sub(j, j) == ":" then
        key, pos = text, j + 1
      else
        out[#out + 1] = text .. "\0"
        size = size + #text + 1
        if messages and depth == 2 and key == "role" and text == "user" then user = true end
        key, pos = nil, after
      end
    elseif c == "[" or c == "{" then
      depth, pos = depth + 1, i + 1
    else
      depth, pos = depth - 1, i + 1
      if messages and depth == 1 and user then break end
    end
  end
  return table.concat(out):sub(1, limit)
end

local function skip_string(s, i)
  -- s:sub(i, i) is an opening quote: the byte after its closing quote, or nil past the end of s.
  local pos = i + 1
  while true do
    local j = s:find('["\\]', pos)
    if j == nil then return nil end
    if s:sub(j, j) == '"' then return j + 1 end
    pos = j + 2
  end
end

local function skip_value(s, i)
  -- The byte after the JSON value that starts at s[i], or nil when it runs past the end of s. A depth
  -- count, no recursion and no validation: every byte is looked at once at most (by string.find).
  local c = s:sub(i, i)
  if c == '"' then return skip_string(s, i) end
  if c ~= "{" and c ~= "[" then return s:find("[,}%]]", i) end
  local depth, pos = 0, i
  while true do
    local j = s:find('[%[%]{}"]', pos)
    if j == nil then return nil end
    local d = s:sub(j, j)
    if d == '"' then
      pos = skip_string(s, j)
      if pos == nil then return nil end
    elseif d == "{" or d == "[" then
      depth, pos = depth + 1, j + 1
    else
      depth, pos = depth - 1, j + 1
      if depth == 0 then return pos end
    end
  end
end

local function top_fields(s, wanted)
  -- The top-level fields of the JSON object in s (a window of the body, maybe cut short) whose names are
  -- in WANTED: name -> {kind = "string"|"array"|"object"|"other", first = ..., last = ...} (a value cut by
  -- the window ends at #s). Stops at the first thing that is not a well-formed field.
  local fields, pos = {}, s:find("[^ \t\r\n]")
  if pos == nil or s:sub(pos, pos) ~= "{" then return fields end
  pos = pos + 1
  while true do
    pos = s:find("[^ \t\r\n,]", pos)
    if pos == nil or s:sub(pos, pos) ~= '"' then return fields end
    local after = skip_string(s, pos)
    if after == nil then return fields end
    local name = s:sub(pos + 1, after - 2) -- as written: the names wanted have no escapes
    local colon = s:find("[^ \t\r\n]", after)
    if colon == nil or s:sub(colon, colon) ~= ":" then return fields end
    local first = s:find("[^ \t\r\n]", colon + 1)
    if first == nil then return fields end
    local stop = skip_value(s, first)
    local c = s:sub(first, first)
    if wanted[name] and fields[name] == nil then
      local kind = (c == '"' and "string") or (c == "[" and "array") or (c == "{" and "object") or "other"
      fields[name] = { kind = kind, first = first, last = (stop or (#s + 1)) - 1 }
    end
    if stop == nil then return fields end
    pos = stop
  end
end

local function hash_hex(text)
  local a, b = 0, 0
  for i = 1, #text do
    local c = text:byte(i)
    a = (a * 131 + c) % 2147483647
    b = (b * 137 + c) % 2147483629
  end
  return string.format("%08x%08x", a, b)
end

local function prompt_prefix(raw, fields, bare)
  -- The leading prompt text of an OpenAI request (empty: nothing to key on, e.g. embeddings).
  local function of(name, messages)
    local f = fields[name]
    if f == nil or (f.kind ~= "string" and f.kind ~= "array") then return "" end
    return leading_strings(raw, f.first, f.last, PREFIX_BYTES, messages and f.kind == "array")
  end
  if bare == "/v1/chat/completions" then return of("messages", true) end
  if bare == "/v1/completions" then return of("prompt", false) end
  if bare == "/v1/responses" then return (of("instructions", false) .. of("input", true)):sub(1, PREFIX_BYTES) end
  return ""
end

local function prefix_key(headers, raw, fields, bare)
  -- "s<hash>" of the client's session header, else "p<hash>" of the prompt prefix, else nil.
  local session = headers:get(SESSION_HEADER)
  if session ~= nil and session ~= "" then return "s" .. hash_hex(session) end
  if raw == nil then return nil end
  local text = prompt_prefix(raw, fields, bare)
  if text == "" then return nil end
  return "p" .. hash_hex(text)
end
"""

ROUTER = r"""
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

CLUSTER_MAIN = r"""
-- The prefix key's filter: in the cluster an EnvoyExtensionPolicy on the Gateway, which runs after the
-- AI Gateway's external processor (it has parsed the body, answered a malformed one and set
-- MODEL_HEADER); locally the second Lua filter, after the body router that stands in for it. It only
-- writes the key; routing on "model" is the AI Gateway's.
function envoy_on_request(handle)
  local headers = handle:headers()
  headers:remove(PREFIX_KEY_HEADER) -- never the client's copy
  if not PREFIX_MODELS[headers:get(MODEL_HEADER) or ""] then return end -- no body read for the others
  local path = headers:get(":path") or ""
  local bare = path:match("^[^?]*")
  if headers:get(":method") ~= "POST" or not PATHS[bare] then return end
  local session = headers:get(SESSION_HEADER)
  if session ~= nil and session ~= "" then
    headers:replace(PREFIX_KEY_HEADER, "s" .. hash_hex(session))
    return
  end
  local body = handle:body()
  headers = handle:headers() -- objects from before a yield are out of scope after it
  if body == nil then return end
  local length = body:length()
  if length == 0 then return end
  -- at most SCAN_BYTES of the body, whatever its size: the work of one request is bounded by them
  local raw = body:getBytes(0, math.min(length, SCAN_BYTES))
  local key = prefix_key(headers, raw, top_fields(raw, PROMPT_FIELDS), bare)
  if key ~= nil then headers:replace(PREFIX_KEY_HEADER, key) end
end
"""

SOURCE = PARSER + ROUTER


def key_prelude(prefix_bytes: int, paths: tuple[str, ...], prefix_models: tuple[str, ...] = ()) -> str:
    """The constants the key code reads: the prefix, the headers, the accepted POST ``paths``, the
    model names (routes) that route by prefix, the fields it reads and its window."""
    from gennstack.gateway.config import PREFIX_KEY_HEADER, SESSION_HEADER

    listed = ", ".join(f"[{json.dumps(p)}] = true" for p in paths)
    models = ", ".join(f"[{json.dumps(m)}] = true" for m in prefix_models)
    fields = ", ".join(f"[{json.dumps(f)}] = true" for f in PROMPT_FIELDS)
    return (f"local PREFIX_BYTES = {int(prefix_bytes)}\nlocal SCAN_BYTES = {scan_bytes(prefix_bytes)}\n"
            f"local PREFIX_KEY_HEADER = {json.dumps(PREFIX_KEY_HEADER)}\n"
            f"local SESSION_HEADER = {json.dumps(SESSION_HEADER)}\nlocal MODEL_HEADER = {json.dumps(MODEL_HEADER)}\n"
            f"local PATHS = {{{listed}}}\nlocal PREFIX_MODELS = {{{models}}}\nlocal PROMPT_FIELDS = {{{fields}}}\n")


def prefix_key_script(prefix_bytes: int, paths: tuple[str, ...], prefix_models: tuple[str, ...]) -> str:
    """The prefix key's Lua for the model names in ``prefix_models`` (the routes with prefix routing):
    the cluster's EnvoyExtensionPolicy and the local gateway's second Lua filter."""
    return key_prelude(prefix_bytes, paths, prefix_models) + KEY + CLUSTER_MAIN
