# libflashdecode_mpi (context-parallel decode over MPI), fdmpi-bench and the MPI tests.
# Included by the Makefile; built only where `mpicc` runs (Open MPI from Debian:
# openmpi-bin, libopenmpi-dev). `make mpi` builds the library and the benchmark,
# `make test-mpi` runs tests/test_mpi.sh (np 1, 2, 3, 4); without MPI both say so.
MPICC    ?= mpicc
HAVE_MPI := $(if $(shell command -v $(MPICC) 2>/dev/null),yes)
MPI_SKIP := skipped: no MPI (apt-get install openmpi-bin libopenmpi-dev)
MPI_SO_NAME := libflashdecode_mpi.so.$(SOMAJOR)
MPI_SO_REAL := libflashdecode_mpi.so.$(VERSION)
MPI_DATA := mpi/fdmpi_data.c tools/fdgen/ref.c
.PHONY: mpi test-mpi

ifeq ($(HAVE_MPI),yes)
MPI_TARGETS := $(B)/libflashdecode_mpi.so $(B)/libflashdecode_mpi.a $(B)/fdmpi-bench $(B)/test_mpi
mpi: $(B)/libflashdecode_mpi.so $(B)/libflashdecode_mpi.a $(B)/fdmpi-bench
all: $(MPI_TARGETS)

# The library: one object, hidden visibility but for flashdecode_mpi.h; the .so links libflashdecode.so.
# fd_keydefs.h (generated): the KV dtypes' row bytes, for views of a shard from a window's first key.
$(B)/mpi/flashdecode_mpi.o: mpi/flashdecode_mpi.c mpi/flashdecode_mpi.h runtime/flashdecode.h $(B)/fd_keydefs.h | $(B)/config.mk
	@mkdir -p $(B)/mpi
	$(MPICC) $(WARN) $(CFLAGS) -fPIC -fvisibility=hidden -Iruntime -Impi -I$(B) -c $< -o $@
$(B)/$(MPI_SO_REAL): $(B)/mpi/flashdecode_mpi.o $(B)/libflashdecode.so $(B)/$(SO_NAME)
	$(MPICC) -shared -Wl,-soname,$(MPI_SO_NAME) -Wl,--no-undefined -o $@ $< -L$(B) -lflashdecode -lm
$(B)/$(MPI_SO_NAME) $(B)/libflashdecode_mpi.so: $(B)/$(MPI_SO_REAL)
	ln -sf $(MPI_SO_REAL) $@
$(B)/libflashdecode_mpi.a: $(B)/mpi/flashdecode_mpi.o
	rm -f $@; ar rcs $@ $<

# The benchmark links statically (the internal archive: shape sets are read by the embedded generator).
$(B)/fdmpi-bench: mpi/fdmpi_bench.c $(MPI_DATA) mpi/fdmpi_data.h $(B)/libflashdecode_mpi.a $(INTERNAL_A)
	$(MPICC) $(WARN) $(CFLAGS) $(INC) -Impi -Itools/fdgen $< $(MPI_DATA) $(B)/libflashdecode_mpi.a $(INTERNAL_A) \
	  $(LIBS) -o $@

# The test links the shared libraries, as an application would.
$(B)/test_mpi: tests/test_mpi.c $(MPI_DATA) mpi/fdmpi_data.h tests/tcheck.c tools/fdgen/problem.c \
	  $(B)/libflashdecode_mpi.so $(B)/$(MPI_SO_NAME) $(B)/$(SO_NAME)
	$(MPICC) $(WARN) $(CFLAGS) -Iruntime -Impi -Itests -Itools/fdgen $< $(MPI_DATA) tests/tcheck.c tools/fdgen/problem.c \
	  -L$(B) -lflashdecode_mpi -lflashdecode -lm -Wl,-rpath,'$$ORIGIN' -o $@
test-mpi: $(B)/test_mpi
	B=$(B) bash tests/test_mpi.sh
else
MPI_TARGETS :=
mpi:
	@echo "$(MPI_SKIP)"
test-mpi:
	@B=$(B) bash tests/test_mpi.sh
endif

# fdmpi-bench at np 1, 2, 4 into results/mpi/<machine>.md (a benchmark, not a test).
.PHONY: bench-mpi
bench-mpi: mpi
	$(if $(HAVE_MPI),B=$(B) bash mpi/bench.sh,@echo "$(MPI_SKIP)")
