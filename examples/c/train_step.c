/* A synthetic training step traced through the candle-trace C ABI: a 2-layer
 * MLP's forward, backward and optimizer step, with ops, tensors, tensor stats,
 * memory, a loss scalar and one gradient per parameter under an exact
 * gradient contract. The arithmetic is real (small float32 matmuls on the
 * host), so the stats and norms in the trace are the numbers of this step.
 *
 *   make demo        # builds the library and this program, runs it, checks the trace
 *   ./build/train_step traces/demo.jsonl
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "candle_trace.h"

#define BATCH 16
#define IN 32
#define HIDDEN 64
#define OUT 8

#define CHECK(call)                                                                   \
    do {                                                                              \
        ct_status st_ = (call);                                                       \
        if (st_ != CT_OK) {                                                           \
            fprintf(stderr, "%s:%d: %s failed (%d): %s\n", __FILE__, __LINE__, #call, \
                    (int)st_, ct_last_error());                                       \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

static ct_session S;

static float frand(unsigned *seed) {
    *seed = *seed * 1664525u + 1013904223u;
    return ((float)(*seed >> 8) / (float)(1u << 24)) * 2.0f - 1.0f;
}

/* y[b][o] = sum_i x[b][i] * w[o][i] */
static void matmul(const float *x, const float *w, float *y, int b, int in, int out) {
    for (int r = 0; r < b; r++)
        for (int o = 0; o < out; o++) {
            float acc = 0;
            for (int i = 0; i < in; i++) acc += x[r * in + i] * w[o * in + i];
            y[r * out + o] = acc;
        }
}

/* Runs f, then records it as an op spanning the time it took. */
static void traced_op(ct_span span, const char *name, const char *const *inputs, size_t n_in,
                      const char *output, int64_t rows, int64_t cols, uint64_t input_bytes,
                      uint64_t started) {
    int64_t shape[2] = {rows, cols};
    uint64_t now = ct_now_ns(S);
    ct_op op = {.size = sizeof op,
                .op_name = name,
                .dtype = "f32",
                .device = "cpu",
                .inputs = inputs,
                .n_inputs = n_in,
                .output = output,
                .shape = shape,
                .rank = 2,
                .duration_ns = now > started ? now - started : 1,
                .timestamp_ns = started,
                .input_dense_bytes = input_bytes};
    CHECK(ct_record_op(S, span, &op));
    ct_tensor t = {.size = sizeof t, .tensor_id = output, .dtype = "f32", .device = "cpu",
                   .label = name, .shape = shape, .rank = 2, .category = CT_CATEGORY_ACTIVATION};
    CHECK(ct_record_tensor(S, span, &t));
}

static void memory(ct_span span, ct_memory_action action, const char *storage, const char *tensor,
                   int64_t rows, int64_t cols, ct_category cat) {
    int64_t shape[2] = {rows, cols};
    ct_memory m = {.size = sizeof m, .storage_id = storage, .tensor_id = tensor, .device = "cpu",
                   .dtype = "f32", .bytes = (uint64_t)(rows * cols * 4), .shape = shape,
                   .rank = 2, .category = cat};
    CHECK(ct_record_memory(S, span, action, &m));
}

static double norm(const float *g, int n) {
    double acc = 0;
    for (int i = 0; i < n; i++) acc += (double)g[i] * g[i];
    return sqrt(acc);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "traces/demo.jsonl";
    const char *run =
        "{\"entrypoint\":\"demo::train_step\",\"phase\":\"train\",\"capture_step\":3,"
        "\"device\":\"cpu\",\"tags\":{\"example\":\"c\"},"
        "\"capture_contract\":{\"measurement_scope\":\"profiled_work\",\"operations\":\"complete\","
        "\"activations\":\"partial\",\"tensors\":\"partial\",\"gradients\":\"complete\","
        "\"logical_memory\":\"partial\",\"physical_memory\":\"none\",\"device_timing\":\"none\","
        "\"required_semantic_labels\":[\"mlp/forward\",\"mlp/backward\",\"sgd/step\"],"
        "\"gradient_contract\":{\"expected\":["
        "{\"root\":\"mlp\",\"key\":\"fc1.weight\",\"family\":\"fc1\"},"
        "{\"root\":\"mlp\",\"key\":\"fc2.weight\",\"family\":\"fc2\"}],"
        "\"families\":[{\"family\":\"fc1\",\"expectation\":\"active\",\"min_present\":1},"
        "{\"family\":\"fc2\",\"expectation\":\"active\",\"min_present\":1}]}}}";
    CHECK(ct_open(path, run, &S));

    unsigned seed = 42;
    static float x[BATCH * IN], w1[HIDDEN * IN], w2[OUT * HIDDEN], h[BATCH * HIDDEN],
        y[BATCH * OUT], gy[BATCH * OUT], gw1[HIDDEN * IN], gw2[OUT * HIDDEN], gh[BATCH * HIDDEN];
    for (int i = 0; i < BATCH * IN; i++) x[i] = frand(&seed);
    for (int i = 0; i < HIDDEN * IN; i++) w1[i] = frand(&seed) * 0.2f;
    for (int i = 0; i < OUT * HIDDEN; i++) w2[i] = frand(&seed) * 0.2f;

    ct_span update, fwd, bwd, opt;
    CHECK(ct_measurement_begin(S, "train/update", &update));

    /* forward */
    CHECK(ct_span_begin(S, "mlp/forward", CT_SPAN_MODULE, CT_STEP_FORWARD, &fwd));
    uint64_t t = ct_now_ns(S);
    matmul(x, w1, h, BATCH, IN, HIDDEN);
    for (int i = 0; i < BATCH * HIDDEN; i++) h[i] = h[i] > 0 ? h[i] : 0; /* relu */
    const char *in1[] = {"x", "fc1.weight"};
    traced_op(fwd, "matmul_relu", in1, 2, "h", BATCH, HIDDEN, (BATCH * IN + HIDDEN * IN) * 4, t);
    memory(fwd, CT_MEMORY_ALLOC, "cpu-h", "h", BATCH, HIDDEN, CT_CATEGORY_ACTIVATION);
    t = ct_now_ns(S);
    matmul(h, w2, y, BATCH, HIDDEN, OUT);
    const char *in2[] = {"h", "fc2.weight"};
    traced_op(fwd, "matmul", in2, 2, "y", BATCH, OUT, (BATCH * HIDDEN + OUT * HIDDEN) * 4, t);
    memory(fwd, CT_MEMORY_ALLOC, "cpu-y", "y", BATCH, OUT, CT_CATEGORY_ACTIVATION);
    int64_t yshape[2] = {BATCH, OUT};
    CHECK(ct_record_tensor_stats_f32(S, fwd, "mlp/output", y, yshape, 2));
    double loss = 0;
    for (int i = 0; i < BATCH * OUT; i++) loss += 0.5 * (double)y[i] * y[i] / BATCH;
    CHECK(ct_record_scalar(S, fwd, "loss", loss));
    CHECK(ct_record_data_edge(S, "h", "y"));
    CHECK(ct_span_end(S, fwd));
    CHECK(ct_record_call_edge(S, update, fwd, 0));

    /* backward of loss = 0.5 * |y|^2 / BATCH */
    CHECK(ct_span_begin(S, "mlp/backward", CT_SPAN_MODULE, CT_STEP_BACKWARD, &bwd));
    t = ct_now_ns(S);
    for (int i = 0; i < BATCH * OUT; i++) gy[i] = y[i] / BATCH;
    memset(gw2, 0, sizeof gw2);
    memset(gh, 0, sizeof gh);
    for (int r = 0; r < BATCH; r++)
        for (int o = 0; o < OUT; o++)
            for (int k = 0; k < HIDDEN; k++) {
                gw2[o * HIDDEN + k] += gy[r * OUT + o] * h[r * HIDDEN + k];
                gh[r * HIDDEN + k] += gy[r * OUT + o] * w2[o * HIDDEN + k];
            }
    memset(gw1, 0, sizeof gw1);
    for (int r = 0; r < BATCH; r++)
        for (int k = 0; k < HIDDEN; k++) {
            if (h[r * HIDDEN + k] <= 0) continue;
            for (int i = 0; i < IN; i++) gw1[k * IN + i] += gh[r * HIDDEN + k] * x[r * IN + i];
        }
    const char *inb[] = {"y", "h"};
    traced_op(bwd, "matmul_backward", inb, 2, "fc1.weight.grad", HIDDEN, IN,
              (BATCH * OUT + BATCH * HIDDEN) * 4, t);
    memory(bwd, CT_MEMORY_FREE, "cpu-y", "y", BATCH, OUT, CT_CATEGORY_ACTIVATION);
    memory(bwd, CT_MEMORY_FREE, "cpu-h", "h", BATCH, HIDDEN, CT_CATEGORY_ACTIVATION);
    CHECK(ct_span_end(S, bwd));

    double n1 = norm(gw1, HIDDEN * IN), n2 = norm(gw2, OUT * HIDDEN);
    CHECK(ct_record_gradient(S, "mlp", "fc1.weight", n1 > 0 ? CT_GRADIENT_PRESENT : CT_GRADIENT_ZERO, &n1));
    CHECK(ct_record_gradient(S, "mlp", "fc2.weight", n2 > 0 ? CT_GRADIENT_PRESENT : CT_GRADIENT_ZERO, &n2));

    /* optimizer: plain SGD */
    CHECK(ct_span_begin(S, "sgd/step", CT_SPAN_FUNCTION, CT_STEP_OPTIMIZER, &opt));
    t = ct_now_ns(S);
    for (int i = 0; i < HIDDEN * IN; i++) w1[i] -= 0.1f * gw1[i];
    for (int i = 0; i < OUT * HIDDEN; i++) w2[i] -= 0.1f * gw2[i];
    const char *ino[] = {"fc1.weight", "fc1.weight.grad"};
    traced_op(opt, "sgd_update", ino, 2, "fc1.weight.next", HIDDEN, IN, HIDDEN * IN * 8, t);
    int64_t w1shape[2] = {HIDDEN, IN};
    CHECK(ct_record_tensor_stats_f32(S, opt, "fc1.weight", w1, w1shape, 2));
    CHECK(ct_span_end(S, opt));

    CHECK(ct_span_end(S, update));
    CHECK(ct_finish(S));
    printf("wrote %s (loss %.6f, |grad fc1| %.6f, |grad fc2| %.6f)\n", path, loss, n1, n2);
    return 0;
}
