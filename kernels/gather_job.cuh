// The description of one gather job: J_WORDS int64 words, built by hmgstore/cuda/gather.py
// (job_words), read by kernels/gather.cu. This header is the one definition of the layout:
// the Python side parses these #defines (names, integer values and +/- of earlier names),
// and the kernel source is compiled with this header in front of it.
#define MAX_TIERS 10  // GPU, replica, up to 8 peer shards, host

#define J_IDS 0         // const int32/int64* ids (device)
#define J_PERM 1        // const int64* output position per id, or 0: position = r
#define J_OUT 2         // char* output rows, row_bytes apart
#define J_MAP 3         // const int32/int64* new id per old id, or 0: new id = id
#define J_N 4           // rows in this job
#define J_NUM_ROWS 5    // rows of the table (ids must be below)
#define J_ROW_BYTES 6
#define J_TILE_START 7  // first tile of this job in the launch
#define J_FLAGS 8       // F_* bits below
#define J_NTIERS 9
#define J_BOUNDS 10                          // MAX_TIERS + 1 words: new-id boundaries of the tiers
#define J_BASE (J_BOUNDS + MAX_TIERS + 1)    // MAX_TIERS words: address of each tier's first row
#define J_PITCH (J_BASE + MAX_TIERS)         // MAX_TIERS words: bytes between a tier's rows
#define J_NARROW (J_PITCH + MAX_TIERS)       // bit t set: tier t stores rows in the job's format (F_FMT_*), decoded
#define J_LOCAL (J_NARROW + 1)   // bit t set: tier t is in the launching GPU's own memory (PASS_LOCAL reads it)
#define J_WORDS (J_LOCAL + 1)

#define F_IDS64 1         // ids are int64 (else int32)
#define F_MAP64 2         // map is int64 (else int32)
#define F_VEC_SHIFT 8     // bits 8..15: log2 of the vector width in bytes
#define F_TPR_SHIFT 16    // bits 16..23: log2 of the threads per row (team size)
#define F_NVEC_SHIFT 24   // bits 24..31: log2 of the stored values each narrow load reads (0, 2, 3 or 4)
#define F_FMT_SHIFT 32    // bits 32..39: the narrow tiers' format, one per job (hmgstore/rows/formats.py):
#define FMT_F16 1         //   float16
#define FMT_BF16 2        //   bfloat16
#define FMT_E4M3 3        //   float8 e4m3 values, then a float32 scale per row
#define FMT_INT8 4        //   int8 values, then a float32 scale per row

// A launch's pass: which of its rows it copies. A capped gather of a table with rows in GPU memory and rows
// elsewhere may run two launches (hmgstore/cuda/gather.py says when): the local rows with the GPU's full width,
// the others (host, peer GPUs) under the cap, where they wait on the link.
#define PASS_ALL 0     // every row, and ids out of range
#define PASS_LOCAL 1   // rows of tiers with their J_LOCAL bit set
#define PASS_REMOTE 2  // rows of the other tiers, and ids out of range

// The error record a launch may be given (4 int64 words, device memory, zeroed): the first id out of
// range sets E_FLAG to 1 and writes which job, which output position and the id itself.
#define E_FLAG 0
#define E_JOB 1
#define E_POSITION 2
#define E_VALUE 3
#define E_WORDS 4
