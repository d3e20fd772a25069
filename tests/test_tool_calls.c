/* Tool calls: an answer's calls read as vLLM's hermes parser reads Qwen's (the text before them the content; an
 * unclosed last block read; a block that is no call leaves the answer text; a stream's text held back from where a
 * block may start) and as its llama3_json parser reads Llama 3.1's (an answer that opens with a call is calls, ";"
 * between them; anything else text), their arguments written as Python's
 * json.dumps writes them; and what the templates refuse (tools, a tool's message or an answer's calls where the
 * template renders none; a call without a name or with arguments that are not an object). The prompts with tools
 * themselves are held to apply_chat_template's in test_sft. */
#include "serve/serve_internal.h"
#include "io/json_text.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed;

static void check(const char *what, bool ok, const char *detail) {
    printf("%-90s %s%s%s\n", what, ok ? "ok" : "FAIL", detail ? "  " : "", detail ? detail : "");
    if (!ok) failed = 1;
}

/* The calls read from text: how many, each "name arguments" joined by "; ", and the content's bytes. */
static void calls_of(int form, const char *text, int *n, char *out, size_t cap, size_t *content) {
    cJSON *calls = serve_tool_calls(form, text, strlen(text), 7, content), *c;
    *n = calls ? cJSON_GetArraySize(calls) : -1;
    out[0] = 0;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function"), *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name"), *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%s %s %s", len ? "; " : "", cJSON_IsString(id) ? id->valuestring : "?",
                 cJSON_IsString(name) ? name->valuestring : "?", cJSON_IsString(args) ? args->valuestring : "?");
    }
    cJSON_Delete(calls);
}

enum { WHOLE = -1 }; /* the content: the whole answer */

static void check_parse(void) {
    enum { H = DT_CHAT_TOOLS_HERMES, J = DT_CHAT_TOOLS_JSON };
    static const struct { int form; const char *what, *text, *want; int n; size_t content; } cases[] = {
        { H, "one call, nothing before it", "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>",
          "call_7_0 add {\"a\": 2, \"b\": 3}", 1, 0 },
        { H, "two calls after text (the content), text between them dropped",
          "Let me look.\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Z\xc3\xbcrich\",\"n\":[1,2.5,null,true]}}\n"
          "</tool_call>\nand\n<tool_call>{\"arguments\": {}, \"name\": \"now\"}</tool_call>",
          "call_7_0 get_weather {\"city\": \"Z\xc3\xbcrich\", \"n\": [1, 2.5, null, true]}; call_7_1 now {}", 2, 13 },
        { H, "a last block the answer ends inside (its length reached)", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"a\\nb\"}}\n",
          "call_7_0 f {\"x\": \"a\\nb\"}", 1, 0 },
        { H, "a block that is not JSON: the answer stays text", "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": \n</tool_call>", "", -1, WHOLE },
        { H, "a block without arguments: the answer stays text", "<tool_call>{\"name\": \"f\"}</tool_call>", "", -1, WHOLE },
        { H, "no block: the answer is text", "The answer is 5.", "", -1, WHOLE },
        { J, "Llama: one call", "{\"name\": \"add\", \"parameters\": {\"a\": 2, \"b\": 3}}", "call_7_0 add {\"a\": 2, \"b\": 3}", 1, 0 },
        { J, "Llama: two calls after <|python_tag|>, \"arguments\" or \"parameters\"",
          "<|python_tag|>{\"name\": \"now\", \"arguments\": {}} ;\n{\"parameters\": {\"s\": \"\xc3\xbc\"}, \"name\": \"f\"}\n",
          "call_7_0 now {}; call_7_1 f {\"s\": \"\xc3\xbc\"}", 2, 0 },
        { H, "arguments written as floats stay floats (2.0, 2.5e+16), as json.dumps writes them back",
          "<tool_call>\n{\"name\": \"scale\", \"arguments\": {\"x\": 2.0, \"k\": 3, \"big\": 25e15, \"n\": -0.0}}\n</tool_call>",
          "call_7_0 scale {\"x\": 2.0, \"k\": 3, \"big\": 2.5e+16, \"n\": -0.0}", 1, 0 },
        { J, "Llama: arguments written as floats stay floats", "{\"name\": \"scale\", \"parameters\": {\"x\": 1E2, \"k\": 3}}",
          "call_7_0 scale {\"x\": 100.0, \"k\": 3}", 1, 0 },
        { J, "Llama: a call after text: the answer is text", "Sure: {\"name\": \"add\", \"parameters\": {}}", "", -1, WHOLE },
        { J, "Llama: text after the call: the answer is text", "{\"name\": \"add\", \"parameters\": {}} done", "", -1, WHOLE },
        { J, "Llama: an object without a name: the answer is text", "{\"parameters\": {\"a\": 1}}", "", -1, WHOLE },
        { J, "Llama: a call without parameters: the answer is text", "{\"name\": \"f\"}", "", -1, WHOLE },
        { J, "Llama: a call cut short: the answer is text", "{\"name\": \"f\", \"parameters\": {\"a\"", "", -1, WHOLE },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int n;
        char got[512], what[160], detail[700];
        size_t content;
        calls_of(cases[k].form, cases[k].text, &n, got, sizeof got, &content);
        snprintf(what, sizeof what, "tool calls read: %s", cases[k].what);
        snprintf(detail, sizeof detail, "%d call(s) [%s], content %zu bytes", n, got, content);
        size_t want = cases[k].content == (size_t)WHOLE ? strlen(cases[k].text) : cases[k].content;
        check(what, n == cases[k].n && !strcmp(got, cases[k].want) && content == want, detail);
    }
}

/* Rendering messages (JSON text) by a template with tools (JSON text or NULL): refused with want in the error. */
static void refused(const char *what, dt_chat_kind kind, const char *messages, const char *tools, const char *want) {
    cJSON *m = cJSON_Parse(messages), *t = tools ? cJSON_Parse(tools) : NULL;
    dt_chat_kwargs kw = { .thinking = true, .tools = t };
    char *out = NULL;
    size_t n;
    dt_status st = serve_chat_prompt(m, kind, &kw, &out, &n);
    char name[160];
    snprintf(name, sizeof name, "refused: %s", what);
    check(name, st && strstr(dt_last_error(), want), st ? dt_last_error() : out);
    free(out);
    cJSON_Delete(m), cJSON_Delete(t);
}

static void check_refusals(void) {
    const char *user = "[{\"role\": \"user\", \"content\": \"2 + 3?\"}]", *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"add\"}}]";
    refused("tools for ChatML's template", DT_CHAT_CHATML, user, tools, "'tools': the ChatML template renders no tool calls");
    refused("tools for dtrain's plain template", DT_CHAT_NONE, user, tools, "plain chat template renders no tool calls");
    refused("a tool's message for Llama 3's template", DT_CHAT_LLAMA3,
            "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", \"content\": \"5\"}]", NULL,
            "'messages' [1]: the Llama 3 template renders no tool calls");
    refused("two calls in one answer for Llama 3.1's template", DT_CHAT_LLAMA31,
            "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
            "[{\"function\": {\"name\": \"f\", \"arguments\": {}}}, {\"function\": {\"name\": \"g\", \"arguments\": {}}}]}]", tools,
            "'messages' [1]: 2 tool calls in one answer: Llama 3.1's template writes one");
    refused("Llama 3.2's tools without a user message to go in", DT_CHAT_LLAMA32, "[{\"role\": \"system\", \"content\": \"s\"}]", tools,
            "'messages' [1]: the Llama 3.2 template writes the tools into the first user message, and this is the end of the chat");
    refused("Llama 3.1's tools before an answer, not a user message", DT_CHAT_LLAMA31,
            "[{\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"x\"}]", tools,
            "'messages' [0]: the Llama 3.1 template writes the tools into the first user message, and this is not one");
    refused("a tool's result without content for Llama 3.1's template", DT_CHAT_LLAMA31,
            "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", \"content\": null}]", tools,
            "'messages' [1]: a tool's result needs a 'content'");
    refused("an answer's calls for Llama 3's template", DT_CHAT_LLAMA3,
            "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
            "[{\"function\": {\"name\": \"f\", \"arguments\": {}}}]}]", NULL, "'messages' [1]: the Llama 3 template");
    refused("a call whose arguments are not an object", DT_CHAT_QWEN25,
            "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
            "[{\"function\": {\"name\": \"f\", \"arguments\": \"{x\"}}]}]", tools, "'messages' [1]: tool call 0 needs");
    refused("a call whose arguments' text has more after the object", DT_CHAT_QWEN25,
            "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
            "[{\"function\": {\"name\": \"f\", \"arguments\": \"{} x\"}}]}]", NULL, "'messages' [1]: tool call 0 needs");
    refused("a call without a name", DT_CHAT_QWEN3,
            "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": {}}}]}]",
            tools, "'messages' [1]: tool call 0 needs a function's \"name\"");
    refused("a tool that is not an object", DT_CHAT_QWEN3, user, "[\"add\"]", "'tools' [0]: a tool is an object");
}

/* A stream's text so far: what can go out before the calls are known. */
static void check_stream_text(void) {
    static const struct { int form; const char *text; size_t want; } cases[] = {
        { DT_CHAT_TOOLS_HERMES, "Let me add.", 11 }, { DT_CHAT_TOOLS_HERMES, "Let me add.\n<tool", 12 },
        { DT_CHAT_TOOLS_HERMES, "Let me add.\n<tool_call>\n{\"na", 12 }, { DT_CHAT_TOOLS_HERMES, "<tool_call", 0 },
        { DT_CHAT_TOOLS_HERMES, "a <b> c <", 8 }, { DT_CHAT_TOOLS_HERMES, "", 0 }, { DT_CHAT_TOOLS_HERMES, "x <tool_call>y <tool_call>", 2 },
        { DT_CHAT_TOOLS_JSON, "{\"na", 0 }, { DT_CHAT_TOOLS_JSON, "<|pyth", 0 }, { DT_CHAT_TOOLS_JSON, "<|python_tag|>{", 0 },
        { DT_CHAT_TOOLS_JSON, "", 0 }, { DT_CHAT_TOOLS_JSON, "Hello {", 7 }, { DT_CHAT_TOOLS_JSON, "<b>", 3 },
    };
    bool ok = true;
    char detail[200] = "";
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        size_t got = dt_chat_calls_text(cases[k].form, cases[k].text, strlen(cases[k].text));
        if (got != cases[k].want && ok) snprintf(detail, sizeof detail, "\"%s\": %zu, not %zu", cases[k].text, got, cases[k].want);
        ok = ok && got == cases[k].want;
    }
    check("a stream sends the text before a call, holding back what could begin one (Qwen's, Llama's)", ok, ok ? NULL : detail);
}

/* A call's arguments as OpenAI's API sends them (their JSON text) are written as the object itself, as vLLM passes them
 * to the template (and as test_sft's fixtures, from objects, are rendered). */
static void check_text_arguments(void) {
    const char *as[2] = { "{\"a\": 2, \"b\": 3}", "\"{\\\"a\\\":2,\\\"b\\\":3} \"" };
    char *out[2] = { NULL, NULL }, msgs[512];
    size_t n;
    bool ok = true;
    for (int k = 0; k < 2; k++) {
        snprintf(msgs, sizeof msgs, "[{\"role\": \"user\", \"content\": \"2 + 3?\"}, {\"role\": \"assistant\", \"content\": null, "
                 "\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"add\", \"arguments\": %s}}]}, {\"role\": \"tool\", "
                 "\"content\": \"5\"}]", as[k]);
        cJSON *m = cJSON_Parse(msgs);
        dt_chat_kwargs kw = { .thinking = true };
        ok = ok && m && !serve_chat_prompt(m, DT_CHAT_QWEN25, &kw, &out[k], &n);
        cJSON_Delete(m);
    }
    ok = ok && !strcmp(out[0], out[1]) && strstr(out[0], "<|im_start|>assistant\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n"
                                                       "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n");
    check("a call's arguments as JSON text render as the object", ok, ok ? NULL : out[1] ? out[1] : dt_last_error());
    free(out[0]), free(out[1]);
}

/* An empty answer (the model's first token ended it; its text may be NULL): no calls, no content, by either form. */
static void check_empty(void) {
    size_t ch = 1, cj = 1;
    cJSON *h = dt_chat_calls_read(DT_CHAT_TOOLS_HERMES, NULL, 0, &ch), *j = dt_chat_calls_read(DT_CHAT_TOOLS_JSON, NULL, 0, &cj);
    check("an empty answer: no calls, no content (Qwen's and Llama's forms)", !h && !j && ch == 0 && cj == 0, NULL);
    cJSON_Delete(h), cJSON_Delete(j);
}

/* The compact writer (GRPO's reward lines): cJSON_PrintUnformatted's shape, numbers as json.dumps writes them. */
static void check_compact(void) {
    const char *in = "{\"a\": [1.0, 2, -0.0, 25e15, 0.5, \"\u00e9\\n\\\"\"], \"b\": {}, \"c\": [], \"d\": [true, false, null]}";
    const char *want = "{\"a\":[1.0,2,-0.0,2.5e+16,0.5,\"\u00e9\\n\\\"\"],\"b\":{},\"c\":[],\"d\":[true,false,null]}";
    cJSON *j = dt_json_parse_whole(in);
    char *got = j ? dt_json_print_compact(j) : NULL;
    check("a compact line: cJSON's shape, a float kept a float (1.0, -0.0, 2.5e+16), text as it is", got && !strcmp(got, want), got);
    free(got);
    cJSON_Delete(j);
}

int main(void) {
    check_compact();
    check_parse();
    check_empty();
    check_text_arguments();
    check_stream_text();
    check_refusals();
    printf("%s\n", failed ? "test_tool_calls: FAILED" : "test_tool_calls: all passed");
    return failed != 0;
}
